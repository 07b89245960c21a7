"""ncu's CSV read into per-launch counters (``bench.probes.common``) and the chunked prefill's kernel table
(``bench.probes.gdn_chunked_kernels``): launches in order, values in the units ncu chose brought to us and MB."""
import pytest

from bench.probes import gdn_chunked_kernels as K
from bench.probes.common import ncu_csv_rows, ncu_kernels

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(launch: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return (f'"{launch}","9","python3","h","{kernel}","1","7","(256, 1, 1)","(2064, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


def test_each_launch_keeps_its_metrics_in_launch_order_and_ncu_lines_are_left_out():
    text = "\n".join(["==PROF== Connected to process 9", HEAD,
                      _row(1, "_state_kernel", "gpu__time_duration.sum", "ns", "212,128"),
                      _row(0, "_prep_tiles_kernel", "gpu__time_duration.sum", "us", "451.17"),
                      _row(0, "_prep_tiles_kernel", "dram__bytes_write.sum", "Mbyte", "328.10"),
                      _row(1, "_state_kernel", "dram__bytes_read.sum", "byte", "303,093,504"),
                      "==PROF== Disconnected from process 9"])
    found = ncu_kernels(ncu_csv_rows(text))
    assert [name for name, _ in found] == ["_prep_tiles_kernel", "_state_kernel"]
    assert found[1][1] == {"gpu__time_duration.sum": ("212,128", "ns"), "dram__bytes_read.sum": ("303,093,504", "byte")}
    rows = K._numbers(found)
    assert rows[0] == {"kernel": "_prep_tiles_kernel", "gpu__time_duration.sum": 451.17, "dram__bytes_write.sum": 328.1}
    assert rows[1]["gpu__time_duration.sum"] == pytest.approx(212.128, rel=1e-12)
    assert rows[1]["dram__bytes_read.sum"] == pytest.approx(303.093504, rel=1e-12)
    table = K.table("T=8192", "triton-gdn", rows)
    assert table[0] == "T=8192 triton-gdn: 2 kernels, 663.3 us (ncu, one at a time)"
    assert table[2].split()[:3] == ["_prep_tiles_kernel", "451.2", "68.0%"]


def test_a_run_without_metrics_reads_as_no_kernels():
    assert ncu_kernels(ncu_csv_rows("==ERROR== the profiler could not start\n")) == []
