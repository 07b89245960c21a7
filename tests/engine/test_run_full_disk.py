"""A run that fills its disk, on a real small filesystem: a tmpfs mounted for the test when it can
mount one (root), else a file-size limit (RLIMIT_FSIZE) on the run's process. Either way: exit 3,
one line, whole records only in cells.jsonl, `stopped` in run.json, and `--resume` on a disk with
room completes the run to exactly the pairs of an uninterrupted one."""
import json
import os
import resource
import shutil
import subprocess
import sys
import uuid

import pytest

from conformance.run import records, run_folder
from tests.engine.test_run_folders import ROOT

BACKENDS = "toy-good,toy-wrong,toy-bf16-x,toy-wrong-known,toy-good-marked,toy-unsupported"
ARGS = ["conform", "--family", "toy", "--tier", "full", "--backend", BACKENDS]
PAIRS = 20 * 6
ROOM = 96 << 10        # the tmpfs: run.json, the 64 KiB reserve, the lock and about 20 KiB of records
FILE_LIMIT = 48 << 10  # the file-size limit: about 60 records


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "KERNEL_LAB_FAMILY_MODULES": "tests.engine.toy_family",
            "KERNEL_LAB_BACKEND_MODULES": "tests.engine.toy_backends"}


@pytest.fixture
def small_disk(tmp_path):
    """(folder on a small filesystem, how it is small, the limit to apply to the run's process)."""
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={ROOM}", "tmpfs", str(mnt)], capture_output=True).returncode == 0
    try:
        if mounted:
            yield mnt, f"a {ROOM >> 10} KiB tmpfs", None
        else:
            yield mnt, f"RLIMIT_FSIZE of {FILE_LIMIT >> 10} KiB (no tmpfs: not root, or mount refused)", FILE_LIMIT
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _limited(limit):
    if limit is None:
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_stops_the_run_with_whole_records_and_says_so(small_disk, tmp_path):
    disk, how, limit = small_disk
    print(f"full disk made with {how}")
    out = disk / "run"
    done = subprocess.run([sys.executable, "-m", "kernel_lab", *ARGS, "--out", str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600, preexec_fn=_limited(limit))
    assert done.returncode == 3, (how, done.returncode, done.stderr[-2000:])
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("kernel-lab: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, (how, done.stderr[-2000:])
    assert "cannot write a record" in errors[0] and "--resume" in errors[0]
    data = (out / "cells.jsonl").read_bytes()
    assert data.endswith(b"\n"), how
    written = records.read(out / "cells.jsonl")   # every line a whole, valid record
    assert 0 < len(written) < PAIRS, (how, len(written))
    info = json.loads((out / "run.json").read_text())
    assert "cannot write a record" in info["stopped"], how
    assert not (out / run_folder.LOCK_NAME).exists() and not (out / run_folder.RESERVE_NAME).exists()

    # free space: the same folder on a disk with room, resumed to the whole run
    roomy = tmp_path / "roomy"
    shutil.copytree(out, roomy)
    done = subprocess.run([sys.executable, "-m", "kernel_lab", *ARGS, "--out", str(roomy), "--resume"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]   # toy-wrong fails, as in any run of these backends
    resumed = records.read(roomy / "cells.jsonl")
    assert len(resumed) == len({records.key(r) for r in resumed}) == PAIRS
    assert "stopped" not in json.loads((roomy / "run.json").read_text())


def test_a_failed_write_leaves_no_half_line_buffered_for_later(tmp_path):
    """The writer holds nothing back: after a write the limit refuses, the file ends in a whole
    record and closing it adds nothing."""
    code = f"""
import resource, sys
from conformance.run import records
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
w = records.Writer({str(tmp_path / 'cells.jsonl')!r})
n = 0
try:
    while True:
        w.write({{"id": f"c{{n}}", "backend": "b", "status": "pass", "reason": "x" * 300}})
        n += 1
except OSError as exc:
    print(n, exc.errno)
w.close()
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=60)
    n, err = map(int, done.stdout.split())
    assert done.returncode == 0 and err in (27, 28), done.stderr   # EFBIG, or ENOSPC for a short write
    assert len(records.read(tmp_path / "cells.jsonl")) == n > 0


def test_a_full_disk_during_merge_leaves_nothing_there(small_disk, tmp_path):
    disk, how, limit = small_disk
    print(f"full disk made with {how}")
    shards = [tmp_path / f"s{k}" for k in (1, 2)]
    for k, shard in enumerate(shards, 1):
        done = subprocess.run([sys.executable, "-m", "kernel_lab", *ARGS, "--shard", f"{k}/2", "--out", str(shard)],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, done.stderr[-2000:]
    if limit is None:   # leave 16 KiB of the tmpfs free: less than the merged records need
        (disk / "filler").write_bytes(b"\0" * (ROOM - (16 << 10)))
    done = subprocess.run([sys.executable, "-m", "kernel_lab", "merge", "--out", str(disk / "m"), *map(str, shards)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
                          preexec_fn=_limited(None if limit is None else 16 << 10))
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("kernel-lab: error:")]
    assert done.returncode == 3 and len(errors) == 1 and "Traceback" not in done.stderr, (how, done.stderr[-2000:])
    assert "nothing was left there" in errors[0] and not (disk / "m").exists()


def test_no_room_for_a_run_stops_before_any_pair_and_run_json_says_so(tmp_path):
    # a file-size limit below the 64 KiB the run holds back: run.json is written, the reserve is not
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kernel_lab", *ARGS, "--out", str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600, preexec_fn=_limited(32 << 10))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"kernel-lab: error: {out}: no room for a run (")
    info = json.loads((out / "run.json").read_text())
    assert info["stopped"].startswith(f"{out}: no room for a run (") and "finished" not in info
    assert not (out / run_folder.LOCK_NAME).exists() and not (out / run_folder.RESERVE_NAME).exists()
    assert records.read(out / "cells.jsonl") == []
