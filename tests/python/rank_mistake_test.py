"""A call every rank must make, made by rank 0 alone -- the mistake
DeepSpeed's docs warn of (`if rank == 0: engine.save_checkpoint(...)`) --
while rank 1 trains on: both ranks get an error naming what each waits in,
within seconds, instead of waiting for the collective timeout (DeepSpeed's
ranks wait for theirs). Each case in a process pair of its own, since the
group's collectives are over after it:

    zero-run -n 2 -- python rank_mistake_test.py TMPDIR save|load|state_dict|16bit STAGE

Exit status: the number of failed checks (each printed on its rank)."""
import sys
import time

import torch
import torch.nn as nn

import zero_cpp as deepspeed

TMP, MISTAKE, STAGE = sys.argv[1], sys.argv[2], int(sys.argv[3])
NAMED = {"save": "save_checkpoint", "load": "load_checkpoint", "state_dict": "state_dict", "16bit": "allgather"}


def main():
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": STAGE, "stage3_param_persistence_threshold": 0}})
    engine.backward(engine(torch.ones(2, 8)).sum())
    engine.step()
    if MISTAKE == "load":
        engine.save_checkpoint(TMP)  # on every rank
    t0 = time.monotonic()
    try:
        if engine.global_rank == 0:
            {"save": lambda: engine.save_checkpoint(TMP), "load": lambda: engine.load_checkpoint(TMP),
             "state_dict": engine.consolidated_fp32_state_dict,
             "16bit": lambda: engine.save_16bit_model(TMP)}[MISTAKE]()
        else:
            engine.backward(engine(torch.ones(2, 8)).sum())
            engine.step()
        said = "no error"
    except RuntimeError as e:
        said = str(e)
    took = time.monotonic() - t0
    failures = 0
    for ok, what in ((("deadlocked" in said or "disagree" in said) and NAMED[MISTAKE] in said,
                      f"the error names the mistake ({said[:300]})"),
                     (took < 60, f"within seconds, not the collective timeout ({took:.1f} s)")):
        print(("ok   " if ok else "FAIL ") + f"rank {engine.global_rank}, {MISTAKE} on rank 0 alone at stage {STAGE}: "
              + what, flush=True)
        failures += not ok
    sys.exit(failures)


if __name__ == "__main__":
    main()
