// zero::load_weights (include/zero/weights.h): a safetensors file of full
// tensors into a plain module, without an engine; every mismatch named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ckpt/safetensors.h"
#include "zero/weights.h"

namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 8) {
    fc1 = register_module("fc1", torch::nn::Linear(4, hidden));
    norm = register_module("norm", torch::nn::BatchNorm1d(hidden));  // a buffer-holding module
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Net);

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("zero_weights_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Writes the module's params and buffers as `dtype` ("F32" or "BF16"),
// as zero-ckpt consolidate does; `skip`/`extra` make a mismatched file.
std::string write_file(torch::nn::Module& m, const std::string& dtype, const std::string& name,
                       const std::string& skip = "", bool extra = false) {
  std::vector<at::Tensor> keep;
  zero::ckpt::SafetensorsWriter w;
  auto add = [&](const std::string& n, const at::Tensor& t) {
    if (n == skip) return;
    at::Tensor c = t.detach().contiguous();
    if (c.is_floating_point()) c = c.to(dtype == "BF16" ? at::kBFloat16 : at::kFloat);
    keep.push_back(c);
    w.add(n, c.is_floating_point() ? dtype : "I64", c.sizes().vec(), c.data_ptr());
  };
  for (const auto& p : m.named_parameters()) add(p.key(), p.value());
  for (const auto& b : m.named_buffers()) add(b.key(), b.value());
  if (extra) add("head.weight", at::ones({3, 3}));
  const std::string path = tmp_path(name);
  w.write(path);
  return path;
}

std::string error_of(torch::nn::Module& m, const std::string& path) {
  try {
    zero::load_weights(m, path);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(LoadWeights, RoundTripFp32AndBf16) {
  torch::manual_seed(1);
  Net trained;
  trained->norm->running_mean.fill_(0.25);
  for (const std::string dtype : {"F32", "BF16"}) {
    const std::string path = write_file(*trained, dtype, "ok_" + dtype);
    torch::manual_seed(2);
    Net fresh;
    ASSERT_FALSE(torch::equal(fresh->fc1->weight, trained->fc1->weight));
    zero::load_weights(*fresh, path);
    for (const auto& p : trained->named_parameters()) {
      const at::Tensor want = dtype == "F32" ? p.value() : p.value().to(at::kBFloat16).to(at::kFloat);
      EXPECT_TRUE(torch::equal(fresh->named_parameters()[p.key()], want)) << dtype << " " << p.key();
      EXPECT_TRUE(fresh->named_parameters()[p.key()].requires_grad());
    }
    EXPECT_TRUE(torch::equal(fresh->norm->running_mean, trained->norm->running_mean));
    torch::NoGradGuard no_grad;
    fresh->eval(), trained->eval();
    const at::Tensor x = torch::randn({3, 4});
    const double tol = dtype == "F32" ? 0.0 : 0.05;
    EXPECT_LE((fresh->fc2(fresh->norm(fresh->fc1(x))) - trained->fc2(trained->norm(trained->fc1(x)))).abs().max().item<double>(),
              tol) << dtype;
    std::filesystem::remove(path);
  }
}

TEST(LoadWeights, NamesEveryMismatchAndChangesNothing) {
  Net trained;
  const std::string missing = write_file(*trained, "F32", "missing", "fc2.bias", /*extra=*/true);
  Net other;
  const at::Tensor before = other->fc1->weight.clone();
  const std::string e = error_of(*other, missing);
  EXPECT_NE(e.find("param fc2.bias [2] is not in the file"), std::string::npos) << e;
  EXPECT_NE(e.find("the file's head.weight [3, 3] is no param or buffer of the module"), std::string::npos) << e;
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_TRUE(torch::equal(other->fc1->weight, before));  // checked before anything is copied

  Net wide(16);
  const std::string shapes = write_file(*trained, "F32", "shapes");
  const std::string e2 = error_of(*wide, shapes);
  EXPECT_NE(e2.find("fc1.weight is [8, 4] in the file, [16, 4] in the module"), std::string::npos) << e2;
  EXPECT_NE(e2.find("fc2.weight is [2, 8] in the file, [2, 16] in the module"), std::string::npos) << e2;

  EXPECT_NE(error_of(*other, tmp_path("absent")).find("absent"), std::string::npos);
  std::filesystem::remove(missing);
  std::filesystem::remove(shapes);
}

}  // namespace
