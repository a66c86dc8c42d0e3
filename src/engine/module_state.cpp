#include "engine/module_state.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include <torch/nn/module.h>

#include "comm/signature.h"

namespace zero {

std::vector<ReplicatedTensor> replicated_tensors(torch::nn::Module& model) {
  std::vector<ReplicatedTensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (!item.value().requires_grad() && seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.push_back({item.key(), item.value(), false});
  for (const auto& item : model.named_buffers(/*recurse=*/true))
    if (item.value().defined() && seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.push_back({item.key(), item.value(), true});
  return out;
}

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// One line per registered tensor, in registration order: what the ranks compare.
std::vector<std::string> model_entries(torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    out.push_back("param '" + item.key() + "' " + shape_of(item.value()) + " " +
                  c10::toString(item.value().scalar_type()) +
                  (item.value().requires_grad() ? " (trainable)" : " (frozen)"));
  for (const auto& item : model.named_buffers(/*recurse=*/true))
    if (item.value().defined())
      out.push_back("buffer '" + item.key() + "' " + shape_of(item.value()) + " " +
                    c10::toString(item.value().scalar_type()));
  return out;
}

uint64_t hash_of(const std::string& s) { return comm::make_signature_record(s).hash; }

}  // namespace

void check_same_model_on_all_ranks(torch::nn::Module& model, comm::Comm& comm, const comm::Group& dp,
                                   const std::string& what) {
  if (dp.size() == 1) return;
  const auto entries = model_entries(model);
  const int n = dp.size();
  const int64_t count = static_cast<int64_t>(entries.size());
  // Round 1: counts and a hash of everything; equal on all ranks is the common case.
  uint64_t total = 0;
  for (const auto& e : entries) total = total * 1000003u + hash_of(e);
  auto mine = at::tensor({count, static_cast<int64_t>(total)}, at::kLong);
  auto all = at::empty({2 * n}, at::kLong);
  comm.all_gather(dp, all, mine, "model check")->wait();
  bool same = true;
  int64_t longest = 0;
  for (int q = 0; q < n; ++q) {
    same &= all[2 * q].item<int64_t>() == count && all[2 * q + 1].item<int64_t>() == static_cast<int64_t>(total);
    longest = std::max(longest, all[2 * q].item<int64_t>());
  }
  if (same) return;
  // Round 2: every entry's hash (padded to the longest list), to find the first difference.
  auto hashes = at::full({longest}, static_cast<int64_t>(0), at::kLong);
  for (int64_t i = 0; i < count; ++i) hashes[i] = static_cast<int64_t>(hash_of(entries[i]));
  auto all_hashes = at::empty({longest * n}, at::kLong);
  comm.all_gather(dp, all_hashes, hashes, "model check")->wait();
  auto h = all_hashes.view({n, longest});
  int64_t first = longest;
  for (int64_t i = 0; i < longest && first == longest; ++i)
    for (int q = 1; q < n; ++q)
      if (h[q][i].item<int64_t>() != h[0][i].item<int64_t>()) first = i;
  if (first == longest) first = 0;  // equal lists but different counts cannot happen; be safe
  // Round 3: each rank's description of that entry.
  constexpr int64_t kText = 256;
  const std::string text = first < count ? entries[first] : "nothing (it has only " + std::to_string(count) + ")";
  auto desc = at::zeros({kText}, at::kByte);
  std::memcpy(desc.data_ptr(), text.data(), std::min<size_t>(text.size(), kText - 1));
  auto all_desc = at::empty({kText * n}, at::kByte);
  comm.all_gather(dp, all_desc, desc, "model check")->wait();
  auto text_of = [&](int q) {
    return std::string(reinterpret_cast<const char*>(all_desc.data_ptr()) + q * kText);
  };
  int other = 1;
  while (other < n && h[other][first].item<int64_t>() == h[0][first].item<int64_t>()) ++other;
  if (other == n) other = 1;
  throw std::invalid_argument(
      (what.empty() ? "zero::Engine: the ranks of " + dp.describe() + " hold different models (every rank must build "
                      "the same one)"
                    : what) +
      ": entry #" + std::to_string(first + 1) + " of the model's params and buffers is " + text_of(0) +
      " on rank " + std::to_string(dp.global_ranks()[0]) + " but " + text_of(other) + " on rank " +
      std::to_string(dp.global_ranks()[other]));
}

}  // namespace zero
