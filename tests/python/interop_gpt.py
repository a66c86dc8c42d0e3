"""Checkpoints shared between the front ends (issue 35 item 4): the bundled
GPT's Python twin (bench/peer_gpt.py's GPT, named as src/models/gpt.cpp
names its params) loads a checkpoint zero-train (C++) saved, and saves one
zero-train loads, at another world size and stage.

    zero-run -n N -- python interop_gpt.py load DIR STAGE OUT.safetensors
        load DIR (any world size, any stage), write the consolidated weights,
        check the client state the C++ run stored, train a step
    zero-run -n N -- python interop_gpt.py save DIR STAGE OUT.safetensors
        train 3 steps, save DIR, write the consolidated weights
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from peer_gpt import GPT  # noqa: E402

import zero_cpp as deepspeed  # noqa: E402

LAYERS, D, HEADS, SEQ = 2, 64, 4, 32


def engine_for(stage):
    torch.manual_seed(99)  # other initial weights than the checkpoint's
    model = GPT(LAYERS, D, HEADS, SEQ)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def step(engine, k):
    g = torch.Generator().manual_seed(k)
    w, r = engine.world_size, engine.global_rank
    t = torch.randint(0, 256, (2 * w, SEQ + 1), generator=g)[2 * r:2 * (r + 1)]
    loss = F.cross_entropy(engine(t[:, :-1]).reshape(-1, 256), t[:, 1:].reshape(-1))
    engine.backward(loss)
    engine.step()
    return loss.item()


def main():
    mode, path, stage, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    engine = engine_for(stage)
    if mode == "load":
        load_path, client = engine.load_checkpoint(path)
        assert load_path is not None, f"no checkpoint loaded from {path}"
        # zero-train's own client state (JSON), as the C++ run stored it.
        assert client.get("seed") == 1234 and client.get("step") == 3, f"client state {client}"
        assert engine.global_steps == 3, f"global_steps {engine.global_steps} after loading"
        engine.save_fp32_model(out)
        loss = step(engine, 10)
        assert loss == loss, "the loss after loading is NaN"
    else:
        for k in range(3):
            step(engine, k)
        engine.save_checkpoint(path, client_state={"from": "python"})
        engine.save_fp32_model(out)
    if engine.global_rank == 0:
        print(f"interop_gpt {mode} stage {stage} on {engine.world_size} ranks: ok")


if __name__ == "__main__":
    main()
