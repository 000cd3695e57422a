"""One rank of a multi-process test: bootstrap through a FileStore, run the worker, write
the result (or the error) as JSON. Started by tests/harness.py."""

import importlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    from jax_r2ccl.transport import bootstrap
    from jax_r2ccl.config import Config
    from jax_r2ccl.errors import R2cclError
    import workers

    out = {"ok": False, "error": "", "cause": "", "peer": -1}
    ep = None
    try:
        cfg = Config.from_env(**spec["config"])
        module, _, name = spec["func"].rpartition(":")   # "module:func" or a name in workers.py
        func = getattr(importlib.import_module(module) if module else workers, name)
        startup_s = None
        if getattr(func, "no_bootstrap", False):
            res = func(None, spec["rank"], spec["world"], spec=spec, **spec["args"])
        else:
            t0 = time.monotonic()
            ep = bootstrap.connect(bootstrap.FileStore(spec["kv"]), spec["rank"], spec["world"],
                                   nics=spec["nics"], config=cfg)
            startup_s = time.monotonic() - t0   # bootstrap: addresses, rails up, everyone ready
            res = func(ep, spec["rank"], spec["world"], **spec["args"])
        out = {"ok": True, "result": res, "startup_s": startup_s}
    except R2cclError as e:
        out.update(error=str(e), cause=e.cause, peer=e.peer)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out.update(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}", cause="python")
    finally:
        with open(spec["out"] + ".tmp", "w") as f:
            json.dump(out, f)
        os.rename(spec["out"] + ".tmp", spec["out"])
        if ep is not None:
            ep.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
