"""A run folder with a hostile string in every text field a run folder carries: markup that would
open an HTML comment or a script, attributes that run code, Markdown links, table pipes, XML's
illegal control characters, line breaks and a lone surrogate. Each copy carries its field's name
(``<<FIELD>>`` below) so a test can tell which field reached which place."""
from __future__ import annotations

import json
from pathlib import Path

from conformance.run.records import STATUSES

# window.__pwned is set only if any of this ever runs as script in the page
PAYLOAD = ("<!--<script>window.__pwned=1</script> <<FIELD>> </script><script>window.__pwned=2</script>"
           "<img src=x onerror=\"window.__pwned=3\"> ]]> '\"& &amp; | *bold* _it_ [link](javascript:window.__pwned=4) "
           "`tick`` \x00\x01\x08\x0b\x1b[31m\x7f\x85\u2028\ufffe\ud800 \n# heading\r\n- item")


def hostile(field: str) -> str:
    return PAYLOAD.replace("<<FIELD>>", f"<<{field}>>")


# Fields whose text must reach the page as text
RECORD_TEXT = ("id", "family", "op", "backend", "rounding_model", "reason", "traceback", "device",
               "retried_from", "tolerance.source", "param.value", "quality.key", "output.name",
               "warning")


def record(status: str, n: int) -> dict:
    h = lambda f: hostile(f"{f}#{n}")  # noqa: E731
    outputs = {h("output.name"): {"max_abs": 1e-3, "margin": 0.5, "nonfinite": 0}}
    params = {"name": h("id"), h("param.key"): h("param.value"), "act": h("param.act")}
    # the id its parts make (a reader refuses a record whose id they contradict)
    cid = "/".join([h("family"), h("op"), *(f"{k}={v}" for k, v in params.items()), f"seed={n}"])
    return {"id": cid, "family": h("family"), "op": h("op"), "params": params, "seed": n,
            "backend": h("backend"), "rounding_model": h("rounding_model"), "status": status,
            "reason": h("reason"), "traceback": h("traceback"), "metrics": outputs[h("output.name")],
            "outputs": outputs, "tolerance": {"atol": 0.0, "rtol": 1e-3, "source": h("tolerance.source")},
            "quality": {h("quality.key"): 0.25}, "duration_s": 0.01, "device": h("device"),
            "retried_from": h("retried_from"), "warnings": [h("warning")]}


def make_run(parent: Path) -> tuple[Path, list[dict]]:
    """A run folder named with markup, one record per status, and a run.json of hostile strings."""
    path = parent / "run <script>window.__pwned=5</script> &amp; `x` | y"
    path.mkdir(parents=True)
    recs = [record(s, n) for n, s in enumerate(STATUSES)]
    (path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    backends = {r["backend"]: {"available": True, "reason": hostile("backend.reason"),
                               "ops": {r["family"]: [r["op"]]}} for r in recs}
    backends[hostile("unavailable")] = {"available": False, "reason": hostile("unavailable.reason"), "ops": {}}
    info = {"cpu": {"model": hostile("cpu.model"), "flags": [hostile("cpu.flag")], "cores": 2},
            "gpus": [{"name": hostile("gpu.name"), "arch": hostile("gpu.arch"), "driver": hostile("gpu.driver")}],
            "os": hostile("os"), "versions": {hostile("version.key"): hostile("version.value")},
            "git": {"commit": hostile("git.commit"), "dirty": True},
            "command": ["kernel-lab", hostile("command")], "started": hostile("started"),
            "finished": hostile("finished"), "elapsed_s": 1.0,
            "selection": {"tier": hostile("tier"), "family": None, "op": None, "backends": list(backends),
                          "filter": hostile("filter"), "shard": None},
            "backends": backends, "rounding_models": {hostile("rm.backend"): {hostile("rm.family"): hostile("rm.model")}},
            "devices": [hostile("devices")], "retired_devices": {hostile("retired"): hostile("retired.why")},
            "stopped": hostile("stopped")}
    (path / "run.json").write_text(json.dumps(info), encoding="utf-8")
    return path, recs
