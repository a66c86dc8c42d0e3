#include "offload/state_swapper.h"

#include <system_error>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "memory/page_buffer.h"
#include "zero/config.h"

namespace zero::offload {

io::AioConfig aio_config(const AioSettings& a) {
  return {a.block_size, static_cast<int>(a.queue_depth), static_cast<int>(a.thread_count), a.single_submit,
          a.overlap_events};
}

SwapperOptions swapper_options(const OffloadConfig& offload, const AioSettings& aio, int rank) {
  SwapperOptions o;
  o.nvme_path = offload.nvme_path;
  o.pipeline_read = offload.pipeline_read;
  o.pipeline_write = offload.pipeline_write;
  o.aio = aio_config(aio);
  o.rank = rank;
  return o;
}

namespace {

int64_t aligned(int64_t bytes) { return (bytes + io::kAlignment - 1) / io::kAlignment * io::kAlignment; }

// The bytes a tensor's transfers move: its whole mapping (direct I/O moves
// whole blocks; the mapping is page-rounded, and pages are 4 KiB).
int64_t transfer_bytes(const at::Tensor& t) { return aligned(static_cast<int64_t>(t.storage().nbytes())); }

// The directory must exist and take a file; said as what to fix.
void check_directory(const std::string& config_key, const std::string& dir, int rank) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  const std::string key = config_key + ".nvme_path \"" + dir + "\"";
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
  const std::string kind =
      o.file_tag.empty() ? o.config_key.substr(o.config_key.rfind('_') + 1) : o.file_tag;  // "optimizer", "param"
  return (std::filesystem::path(o.nvme_path) / ("zero-cpp-" + kind + "-" + std::string(host) + "-" +
                                                std::to_string(getpid()) + "-rank" + std::to_string(o.rank) + ".swp"))
      .string();
}

}  // namespace

StateSwapper::StateSwapper(SwapperOptions options) : options_(std::move(options)) {
  check_directory(options_.config_key, options_.nvme_path, options_.rank);
  path_ = swap_file_name(options_);
  try {
    file_ = std::make_unique<io::DirectFile>(path_, /*scratch=*/false);
  } catch (const io::IoError& e) {
    throw std::runtime_error(options_.config_key + ".nvme_path: cannot open a swap file there: " +
                             std::string(e.what()));
  }
  // Scratch from here on: nothing but this descriptor reaches it, and the
  // kernel frees it when the process ends, whatever ends it.
  ::unlink(path_.c_str());
  engine_ = std::make_unique<io::AioEngine>(options_.aio);
}

StateSwapper::~StateSwapper() {
  try {
    if (engine_) engine_->wait_all();
  } catch (...) {
    // The process is leaving the state behind anyway; the file goes with it.
  }
}

std::string StateSwapper::where(const Slot& s) const {
  return "the " + options_.what + " of " + s.label + " (rank " + std::to_string(options_.rank) + ", swap file " + path_ +
         ")";
}

StateSwapper::Slot& StateSwapper::slot(int index) {
  if (index < 0 || index >= static_cast<int>(slots_.size()))
    throw std::logic_error("StateSwapper: no slot " + std::to_string(index));
  return slots_[static_cast<size_t>(index)];
}

int StateSwapper::add_slot(std::vector<at::Tensor> tensors, const std::string& label) {
  Slot s;
  s.label = label;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.is_cpu() || !t.is_contiguous() || !memory::page_backed(t) ||
        t.data_ptr() != t.storage().data() || reinterpret_cast<uintptr_t>(t.data_ptr()) % io::kAlignment != 0)
      throw std::logic_error("StateSwapper::adopt: " + label +
                             ": state must be contiguous page-backed host buffers (ZERO_PAGE_BUFFERS off?)");
    s.offsets.push_back(file_bytes_ + bytes);
    bytes += transfer_bytes(t);
  }
  try {
    file_->reserve(file_bytes_ + bytes);
  } catch (const io::IoError& e) {
    throw std::runtime_error(options_.config_key + " nvme: reserving " + std::to_string((file_bytes_ + bytes) >> 20) +
                             " MiB for the " + options_.what + " in " + options_.nvme_path + " failed: " + e.what());
  }
  file_bytes_ += bytes;
  s.tensors = std::move(tensors);
  for (const auto& t : s.tensors)
    memory::name_released_contents(t, {{0, static_cast<size_t>(t.nbytes()), options_.what + " of " + label}},
                                   "it is on NVMe (" + options_.config_key + ") between uses; this is a zero-cpp bug");
  s.users = 1;
  slots_.push_back(std::move(s));
  return static_cast<int>(slots_.size()) - 1;
}

int StateSwapper::adopt(std::vector<at::Tensor> tensors, const std::string& label) {
  const int index = add_slot(std::move(tensors), label);
  release(index, /*dirty=*/true);
  flush();
  return index;
}

int StateSwapper::adopt_empty(std::vector<at::Tensor> tensors, const std::string& label) {
  const int index = add_slot(std::move(tensors), label);
  release(index, /*dirty=*/false);  // no disk copy: Empty
  return index;
}

// ---- the transitions ---------------------------------------------------------

void StateSwapper::start_transfer(Slot& s, bool write) {
  abandon_transfer(s);  // nothing is in flight here; if something were, it must end before the pages are reused
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const at::Tensor& t = s.tensors[i];
    s.in_flight.push_back(write ? engine_->write(*file_, t.data_ptr(), transfer_bytes(t), s.offsets[i])
                                : engine_->read(*file_, t.data_ptr(), transfer_bytes(t), s.offsets[i]));
  }
}

void StateSwapper::finish_transfer(Slot& s, const char* what) {
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

void StateSwapper::finish_write(Slot& s) {
  try {
    finish_transfer(s, "writing");
  } catch (...) {
    s.state = State::Resident;  // the pages hold the only whole copy: keep them,
    s.dirty = true;             // and write them at their next release
    throw;
  }
}

void StateSwapper::abandon_transfer(Slot& s) noexcept {
  for (const auto ticket : s.in_flight) {
    try {
      engine_->wait(ticket);
    } catch (...) {
    }
  }
  s.in_flight.clear();
}

void StateSwapper::release_pages(Slot& s) {
  for (const auto& t : s.tensors) memory::release_pages(t);
  s.state = s.disk_copy ? State::OnDisk : State::Empty;
}

void StateSwapper::prefetch(int index) {
  Slot& s = slot(index);
  if (s.state != State::OnDisk) return;
  for (const auto& t : s.tensors) memory::restore_pages(t);
  start_transfer(s, /*write=*/false);
  s.state = State::Reading;
}

void StateSwapper::acquire(int index, Contents contents) {
  Slot& s = slot(index);
  switch (s.state) {
    case State::Empty:
      for (const auto& t : s.tensors) memory::restore_pages(t);  // zeros
      break;
    case State::OnDisk:
      if (contents == Contents::Overwrite) {
        for (const auto& t : s.tensors) memory::restore_pages(t);
        break;
      }
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
      finish_write(s);
      break;
    case State::Resident: break;
  }
  s.state = State::Resident;
  ++s.users;
}

void StateSwapper::release(int index, bool dirty) {
  Slot& s = slot(index);
  if (s.state != State::Resident || s.users == 0)
    throw std::logic_error("StateSwapper::release: " + s.label + " not acquired");
  s.dirty = s.dirty || dirty;
  if (--s.users > 0) return;  // still in use: the last user's release writes it
  if (!s.dirty) return release_pages(s);
  try {
    retire_writes();  // one background write at a time (another slot's failure throws here)
    start_transfer(s, /*write=*/true);
  } catch (...) {
    // Not written: its pages keep the only whole copy, still dirty, written
    // at its next release (as after a failed write). Pieces already
    // submitted are waited for first: they read the pages.
    abandon_transfer(s);
    throw;
  }
  s.dirty = false;
  s.state = State::Writing;
  s.disk_copy = true;  // whole once the write is retired; until then the pages are kept
  if (!options_.pipeline_write) retire_writes();
}

void StateSwapper::retire_writes() {
  for (auto& s : slots_)
    if (s.state == State::Writing) {
      finish_write(s);
      release_pages(s);
    }
}

void StateSwapper::flush() { retire_writes(); }

void StateSwapper::discard(int index) {
  Slot& s = slot(index);
  switch (s.state) {
    case State::Resident:  // with no users only after a failed write, its pages the only copy
      if (s.users > 0) throw std::logic_error("StateSwapper::discard: " + s.label + " is in use");
      break;
    case State::Reading:
    case State::Writing:
      // The transfer reads or writes the pages: let it end; its outcome no longer matters.
      try {
        finish_transfer(s, "discarding");
      } catch (const std::exception&) {
      }
      break;
    case State::Empty:
    case State::OnDisk: break;
  }
  s.disk_copy = false;
  s.dirty = false;
  if (s.state != State::Empty && s.state != State::OnDisk) release_pages(s);
  s.state = State::Empty;
}

std::optional<io::AioEngine::Ticket> StateSwapper::read_copy(int index, void* buffer) {
  Slot& s = slot(index);
  if (s.state != State::OnDisk || s.tensors.size() != 1) return std::nullopt;
  return engine_->read(*file_, buffer, transfer_bytes(s.tensors[0]), s.offsets[0]);
}

void StateSwapper::wait_copy(int index, io::AioEngine::Ticket ticket) {
  Slot& s = slot(index);
  try {
    engine_->wait(ticket);
  } catch (const io::IoError& e) {
    throw std::runtime_error("reading a copy of " + where(s) + " failed: " + e.what());
  }
}

int64_t StateSwapper::copy_bytes(int index) { return transfer_bytes(slot(index).tensors.at(0)); }

int StateSwapper::resident_slots() const {
  int n = 0;
  for (const auto& s : slots_) n += s.state != State::OnDisk && s.state != State::Empty;
  return n;
}

}  // namespace zero::offload
