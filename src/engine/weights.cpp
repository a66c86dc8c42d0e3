// zero::load_weights (include/zero/weights.h): a consolidated safetensors
// file into a plain module, checked whole before anything is copied.
#include "zero/weights.h"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "ckpt/safetensors.h"

namespace zero {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

at::ScalarType file_dtype(const std::string& path, const std::string& name, const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "F64") return at::kDouble;
  if (dtype == "I64") return at::kLong;
  throw std::runtime_error("load_weights: " + path + ": tensor " + name + " is " + dtype +
                           " (F32, BF16, F16, F64 or I64 expected)");
}

}  // namespace

void load_weights(torch::nn::Module& module, const std::string& path) {
  ckpt::SafetensorsFile file(path);
  std::map<std::string, at::Tensor> params, buffers;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) params.emplace(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) buffers.emplace(b.key(), b.value());

  std::vector<std::string> problems;
  for (const auto& [name, t] : params)
    if (!file.has(name)) problems.push_back("param " + name + " " + shape_text(t.sizes().vec()) + " is not in the file");
  for (const auto& [name, e] : file.entries()) {
    const at::Tensor* dest = nullptr;
    if (auto p = params.find(name); p != params.end()) dest = &p->second;
    else if (auto b = buffers.find(name); b != buffers.end()) dest = &b->second;
    if (!dest) {
      problems.push_back("the file's " + name + " " + shape_text(e.shape) + " is no param or buffer of the module");
      continue;
    }
    if (dest->sizes().vec() != e.shape)
      problems.push_back(name + " is " + shape_text(e.shape) + " in the file, " + shape_text(dest->sizes().vec()) +
                         " in the module");
    file_dtype(path, name, e.dtype);
  }
  if (!problems.empty()) {
    std::string msg = "load_weights: " + path + " does not match the module (" + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " difference" : " differences") + "):";
    for (const auto& p : problems) msg += "\n  " + p;
    throw std::runtime_error(msg);
  }

  at::NoGradGuard no_grad;
  for (const auto& [name, e] : file.entries()) {
    const auto p = params.find(name);
    at::Tensor dest = p != params.end() ? p->second : buffers.at(name);
    at::Tensor src = at::from_blob(const_cast<char*>(file.data(name)), e.shape,
                                   at::TensorOptions().dtype(file_dtype(path, name, e.dtype)));
    dest.copy_(src);  // converts dtype and device; tied params take the same value twice
  }
}

}  // namespace zero
