// Exports what a peer implementation needs to train exactly the run
// zero-train does: the GPT's initial weights (built from the same seed) and
// the token windows of every step's global batch. bench/ddp_gpt.py (PyTorch
// DistributedDataParallel) reads them for the side-by-side report.
//
//   bench_export_gpt OUT_DIR LAYERS D_MODEL HEADS SEQ GLOBAL_BATCH STEPS [SEED [DATA]]
// writes OUT_DIR/init.safetensors (fp32, by param name) and
// OUT_DIR/tokens.safetensors ("tokens": int64 [STEPS, GLOBAL_BATCH, SEQ + 1]).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ckpt/safetensors.h"
#include "data/byte_corpus.h"
#include "models/gpt.h"

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: bench_export_gpt OUT_DIR LAYERS D_MODEL HEADS SEQ GLOBAL_BATCH STEPS [SEED [DATA]]\n");
    return 2;
  }
  const std::string out = argv[1];
  zero::models::GPTConfig c;
  c.n_layer = std::atoll(argv[2]);
  c.d_model = std::atoll(argv[3]);
  c.n_head = std::atoll(argv[4]);
  c.seq_len = std::atoll(argv[5]);
  const int64_t batch = std::atoll(argv[6]), steps = std::atoll(argv[7]);
  const uint64_t seed = argc > 8 ? std::strtoull(argv[8], nullptr, 10) : 1234;  // zero-train's default
  const auto corpus = zero::data::ByteCorpus::load(argc > 9 ? argv[9] : zero::data::ByteCorpus::default_path());

  at::manual_seed(seed);  // as zero-train builds its model
  zero::models::GPT model(c);
  std::vector<at::Tensor> keep;
  zero::ckpt::SafetensorsWriter w;
  for (const auto& p : model->named_parameters()) {
    keep.push_back(p.value().detach().contiguous());
    w.add(p.key(), "F32", keep.back().sizes().vec(), keep.back().data_ptr());
  }
  w.write(out + "/init.safetensors");

  std::vector<int64_t> tokens;
  for (int64_t s = 1; s <= steps; ++s) {  // zero-train's steps are 1-based
    const auto w_ = corpus.windows(corpus.step_offsets(s, batch, c.seq_len, seed), c.seq_len);
    tokens.insert(tokens.end(), w_.begin(), w_.end());
  }
  zero::ckpt::SafetensorsWriter t;
  t.add("tokens", "I64", {steps, batch, c.seq_len + 1}, tokens.data());
  t.write(out + "/tokens.safetensors");
  return 0;
}
