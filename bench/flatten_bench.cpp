// Init (flatten) time of the engine's in-place flattening against a plain
// memcpy of the model's bytes, side by side in one run. Prints JSON.
//
//   build/bench/bench_flatten [layers d_model]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt.h"
#include "partition/flat_group.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  zero::models::GPTConfig c;
  c.n_layer = argc > 2 ? std::atoi(argv[1]) : 8;
  c.d_model = argc > 2 ? std::atoi(argv[2]) : 1024;
  c.n_head = 16;
  nlohmann::json runs = nlohmann::json::array();
  for (int rep = 0; rep < 3; ++rep) {
    zero::models::GPT model(c);
    std::vector<at::Tensor> params = model->parameters();
    int64_t bytes = 0;
    for (auto& p : params) bytes += p.numel() * 4;

    // Baseline: copy the same bytes, param by param, into one new buffer
    // (its allocation and first-touch page faults included, as in flatten).
    auto t0 = std::chrono::steady_clock::now();
    char* dst = static_cast<char*>(std::malloc(bytes));
    int64_t off = 0;
    for (auto& p : params) {
      std::memcpy(dst + off, p.data_ptr(), p.numel() * 4);
      off += p.numel() * 4;
    }
    const double memcpy_s = seconds_since(t0);
    std::free(dst);

    // The engine's path: one group, params moved in and their storage freed.
    t0 = std::chrono::steady_clock::now();
    zero::partition::FlatGroup g;
    std::vector<int64_t> numels, idx;
    for (size_t i = 0; i < params.size(); ++i) numels.push_back(params[i].numel()), idx.push_back(i);
    g.params = params;
    g.layout = zero::partition::make_group_layout(numels, idx, 2, 16);
    zero::partition::flatten_into_group(g, at::kFloat);
    const double flatten_s = seconds_since(t0);
    runs.push_back({{"bytes", bytes}, {"memcpy_s", memcpy_s}, {"flatten_s", flatten_s},
                    {"ratio_flatten_to_memcpy", flatten_s / memcpy_s}});
  }
  std::printf("%s\n", nlohmann::json({{"bench", "flatten"}, {"model", c.describe()}, {"runs", runs}}).dump(2).c_str());
}
