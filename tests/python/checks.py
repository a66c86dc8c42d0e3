"""What the Python front end's multi-rank tests share: `check` prints "ok"
on rank 0, "FAIL" on the rank that failed, and records failures; `raises` runs a call that must
raise; `finish` runs the tests (one that raises is a failure, the rest go
on) and gives the exit status, the number of failures (capped: an exit
status is taken mod 256)."""
import traceback

import torch.distributed as dist

failures = []


def check(ok, what):
    # A failure prints on whichever rank saw it: a check that fails on rank 1
    # alone once left nothing but rank 1's exit status.
    if not ok or not dist.is_initialized() or dist.get_rank() == 0:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def raises(fn, kind, text):
    """(whether fn() raised `kind` with `text` in its message, what it said)."""
    try:
        fn()
    except kind as e:
        return text in str(e), str(e).splitlines()[0][:200] if str(e) else ""
    except Exception as e:  # noqa: BLE001 -- the wrong kind is what the check reports
        return False, f"raised {type(e).__name__}: {str(e)[:200]}"
    return False, "did not raise"


def finish(tests, between=None):
    for test in tests:
        try:
            test()
        except Exception:  # noqa: BLE001
            check(False, f"{test.__name__} raised:\n{traceback.format_exc()}")
        if between is not None:
            between()
    if failures or not dist.is_initialized() or dist.get_rank() == 0:
        print(f"{len(failures)} failure(s)" if failures else "all checks passed", flush=True)
    return min(len(failures), 100)
