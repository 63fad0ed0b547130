"""One rule joins an NVML GPU to torch's view of it (vramscope.types), and the monitor's parts use it:
by UUID, which survives ``CUDA_VISIBLE_DEVICES``; by index only where UUIDs cannot be compared."""

from __future__ import annotations

from vramscope.training.gather import GATHER_FIELDS, row_numbers
from vramscope.types import AllocatorReading, GpuReading, HostReading, Sample, allocator_of, gpu_of

GIB = 1024**3


def nvml(index: int, uuid: str | None) -> GpuReading:
    return GpuReading(index=index, uuid=uuid, used_bytes=(index + 1) * GIB, total_bytes=80 * GIB)


def torch_view(device: int, uuid: str | None) -> AllocatorReading:
    return AllocatorReading(device=device, allocated_bytes=GIB, reserved_bytes=2 * GIB, uuid=uuid)


MACHINE = tuple(nvml(i, f"GPU-{i}") for i in range(4))


def test_a_rank_that_sees_one_gpu_as_cuda0_is_matched_by_uuid() -> None:
    # CUDA_VISIBLE_DEVICES=3: torch's device 0 is NVML's GPU 3.
    reading = torch_view(0, "GPU-3")
    assert gpu_of(reading, MACHINE) == MACHINE[3]
    assert allocator_of(MACHINE[3], [reading]) == reading
    assert allocator_of(MACHINE[0], [reading]) is None  # GPU 0 is another rank's, not cuda:0 of this one


def test_without_uuids_the_indexes_are_compared() -> None:
    gpus = tuple(nvml(i, None) for i in range(2))
    reading = torch_view(1, None)
    assert gpu_of(reading, gpus) == gpus[1] and allocator_of(gpus[1], [reading]) == reading
    # One side lacks UUIDs (an old driver, a torch without them): the index is all there is.
    assert gpu_of(torch_view(1, "GPU-1"), gpus) == gpus[1]
    assert allocator_of(MACHINE[2], [torch_view(2, None)]) is not None


def test_a_uuid_the_other_side_does_not_have_matches_nothing() -> None:
    assert gpu_of(torch_view(0, "GPU-9"), MACHINE) is None
    assert allocator_of(nvml(0, "GPU-9"), [torch_view(0, "GPU-0")]) is None
    assert gpu_of(torch_view(0, None), ()) is None and allocator_of(MACHINE[0], ()) is None


def test_the_rank_gather_sends_the_numbers_of_the_rank_s_own_gpu() -> None:
    sample = Sample(time=0.0, elapsed_s=0.0, gpus=MACHINE, allocator=(torch_view(0, "GPU-2"),), host=HostReading())
    values = dict(zip(GATHER_FIELDS, row_numbers(sample, rank=2), strict=True))
    assert values["gpu"] == 2 and values["device"] == 0
    assert values["device_used_bytes"] == MACHINE[2].used_bytes


def test_the_log_and_the_exporter_put_a_rank_s_allocator_on_the_same_gpu() -> None:
    # CUDA_VISIBLE_DEVICES=3: the log row of NVML's GPU 3 carries the allocator, and the exporter labels the
    # allocator's series (the latest and the running peaks) gpu="3", as the GPU's own series.
    from vramscope.exporters.collector import SampleCollector
    from vramscope.logs.schema import sample_rows

    sample = Sample(time=0.0, elapsed_s=0.0, gpus=MACHINE, allocator=(torch_view(0, "GPU-3"),), host=HostReading())
    rows = sample_rows(sample)
    assert [(r["gpu"], r["allocated_bytes"]) for r in rows] == [(3, GIB)]  # only the rank's own GPU
    collector = SampleCollector(host="h")
    collector.update(sample)
    labels = {(s.name, s.labels["gpu"], s.labels["uuid"]) for m in collector.collect() for s in m.samples
              if s.name.startswith("vramscope_allocator_")}
    assert {(name, gpu) for name, gpu, _ in labels} >= {("vramscope_allocator_allocated_bytes", "3"),
                                                       ("vramscope_allocator_peak_allocated_bytes", "3")}
    assert {(gpu, uuid) for _, gpu, uuid in labels} == {("3", "GPU-3")}
    # Without NVML (no GPU readings) torch's own index is all there is.
    collector.update(Sample(time=1.0, elapsed_s=1.0, gpus=(), allocator=(torch_view(0, None),), host=HostReading()))
    assert {s.labels["gpu"] for m in collector.collect() for s in m.samples
            if s.name == "vramscope_allocator_allocated_bytes"} == {"0"}
