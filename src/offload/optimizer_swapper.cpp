#include "offload/optimizer_swapper.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "memory/page_buffer.h"

namespace zero::offload {

namespace {

int64_t aligned(int64_t bytes) { return (bytes + io::kAlignment - 1) / io::kAlignment * io::kAlignment; }

// The bytes a tensor's transfers move: its whole mapping (direct I/O moves
// whole blocks; the mapping is page-rounded, and pages are 4 KiB).
int64_t transfer_bytes(const at::Tensor& t) { return aligned(static_cast<int64_t>(t.storage().nbytes())); }

// The directory must exist and take a file; said as what to fix.
void check_directory(const std::string& dir, int rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  const std::string key = "zero_optimization.offload_optimizer.nvme_path \"" + dir + "\"";
  if (!fs::exists(status))
    throw std::runtime_error(key + " does not exist on rank " + std::to_string(rank) +
                             " (create it on every host, on a fast local disk)");
  if (!fs::is_directory(status)) throw std::runtime_error(key + " is not a directory");
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    throw std::runtime_error(key + " is not writable by rank " + std::to_string(rank) + ": " + std::strerror(errno));
}

std::string swap_file_name(const SwapperOptions& o) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return (std::filesystem::path(o.nvme_path) / ("zero-cpp-optimizer-" + std::string(host) + "-" +
                                                std::to_string(getpid()) + "-rank" + std::to_string(o.rank) + ".swp"))
      .string();
}

}  // namespace

OptimizerSwapper::OptimizerSwapper(SwapperOptions options) : options_(std::move(options)) {
  check_directory(options_.nvme_path, options_.rank);
  path_ = swap_file_name(options_);
  try {
    file_ = std::make_unique<io::DirectFile>(path_, /*scratch=*/false);
  } catch (const io::IoError& e) {
    throw std::runtime_error("zero_optimization.offload_optimizer.nvme_path: cannot open a swap file there: " +
                             std::string(e.what()));
  }
  // Scratch from here on: nothing but this descriptor reaches it, and the
  // kernel frees it when the process ends, whatever ends it.
  ::unlink(path_.c_str());
  engine_ = std::make_unique<io::AioEngine>(options_.aio);
}

OptimizerSwapper::~OptimizerSwapper() {
  try {
    if (engine_) engine_->wait_all();
  } catch (...) {
    // The process is leaving the state behind anyway; the file goes with it.
  }
}

std::string OptimizerSwapper::where(const Slot& s) const {
  return "the optimizer state of " + s.label + " (rank " + std::to_string(options_.rank) + ", swap file " + path_ +
         ")";
}

OptimizerSwapper::Slot& OptimizerSwapper::slot(int index) {
  if (index < 0 || index >= static_cast<int>(slots_.size()))
    throw std::logic_error("OptimizerSwapper: no slot " + std::to_string(index));
  return slots_[static_cast<size_t>(index)];
}

int OptimizerSwapper::adopt(std::vector<at::Tensor> tensors, const std::string& label) {
  Slot s;
  s.label = label;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous() || !memory::page_backed(t) ||
        t.data_ptr() != t.storage().data() || reinterpret_cast<uintptr_t>(t.data_ptr()) % io::kAlignment != 0)
      throw std::logic_error("OptimizerSwapper::adopt: " + label +
                             ": state must be contiguous fp32 page-backed host buffers (ZERO_PAGE_BUFFERS off?)");
    s.offsets.push_back(file_bytes_ + bytes);
    bytes += transfer_bytes(t);
  }
  try {
    file_->reserve(file_bytes_ + bytes);
  } catch (const io::IoError& e) {
    throw std::runtime_error("offload_optimizer nvme: reserving " + std::to_string((file_bytes_ + bytes) >> 20) +
                             " MiB for the optimizer state in " + options_.nvme_path + " failed: " + e.what());
  }
  file_bytes_ += bytes;
  s.tensors = std::move(tensors);
  for (const auto& t : s.tensors)
    memory::name_released_contents(t, {{0, static_cast<size_t>(t.nbytes()), "optimizer state of " + label}},
                                   "it is on NVMe (offload_optimizer) between steps; this is a zero-cpp bug");
  slots_.push_back(std::move(s));
  const int index = static_cast<int>(slots_.size()) - 1;
  release(index, /*dirty=*/true);
  flush();
  return index;
}

// ---- the transitions ---------------------------------------------------------

void OptimizerSwapper::start_transfer(Slot& s, bool write) {
  s.in_flight.clear();
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const at::Tensor& t = s.tensors[i];
    s.in_flight.push_back(write ? engine_->write(*file_, t.data_ptr(), transfer_bytes(t), s.offsets[i])
                                : engine_->read(*file_, t.data_ptr(), transfer_bytes(t), s.offsets[i]));
  }
}

void OptimizerSwapper::finish_transfer(Slot& s, const char* what) {
  std::string failure;
  int error_number = 0;
  for (const auto ticket : s.in_flight) {
    try {
      engine_->wait(ticket);
    } catch (const io::IoError& e) {
      if (failure.empty()) failure = e.what(), error_number = e.error_number();
    }
  }
  s.in_flight.clear();
  if (!failure.empty())
    throw std::runtime_error(std::string(what) + " " + where(s) + " failed: " + failure +
                             (error_number == ENOSPC ? " (the disk is full)" : ""));
}

void OptimizerSwapper::release_pages(Slot& s) {
  for (const auto& t : s.tensors) memory::release_pages(t);
  s.state = State::OnDisk;
}

void OptimizerSwapper::prefetch(int index) {
  Slot& s = slot(index);
  if (s.state != State::OnDisk) return;
  for (const auto& t : s.tensors) memory::restore_pages(t);
  start_transfer(s, /*write=*/false);
  s.state = State::Reading;
}

void OptimizerSwapper::acquire(int index) {
  Slot& s = slot(index);
  switch (s.state) {
    case State::OnDisk:
      prefetch(index);
      [[fallthrough]];
    case State::Reading:
      try {
        finish_transfer(s, "reading");
      } catch (...) {
        release_pages(s);  // what arrived is incomplete: back to the copy on disk
        throw;
      }
      break;
    case State::Writing:
      // Its pages still hold the values being written: use them, and
      // finish the write (so the disk copy is whole) before they change.
      finish_transfer(s, "writing");
      break;
    case State::Resident: break;
  }
  s.state = State::Resident;
}

void OptimizerSwapper::release(int index, bool dirty) {
  Slot& s = slot(index);
  if (s.state != State::Resident) throw std::logic_error("OptimizerSwapper::release: " + s.label + " not acquired");
  if (!dirty) return release_pages(s);
  retire_writes();  // one background write at a time
  start_transfer(s, /*write=*/true);
  s.state = State::Writing;
  if (!options_.pipeline_write) retire_writes();
}

void OptimizerSwapper::retire_writes() {
  for (auto& s : slots_)
    if (s.state == State::Writing) {
      try {
        finish_transfer(s, "writing");
      } catch (...) {
        s.state = State::Resident;  // the pages hold the only whole copy: keep them
        throw;
      }
      release_pages(s);
    }
}

void OptimizerSwapper::flush() { retire_writes(); }

int OptimizerSwapper::resident_slots() const {
  int n = 0;
  for (const auto& s : slots_) n += s.state != State::OnDisk;
  return n;
}

}  // namespace zero::offload
