"""How every benchmark measures: a fresh process per point, its time and memory, and the machine it ran on.

A *point function* ``f(point) -> record`` measures one point (``point`` has the settings as attributes; the
record is a dict of JSON values with ``"status": "ok"``). :func:`launch` runs it in a fresh Python process
(``python -m benchmarks.worker``), so the point's peak memory is its own and no allocator state leaks between
points; an address-space cap makes an over-large point fail fast instead of swapping, and a crash, a timeout
or an out-of-memory becomes the record's ``status`` instead of an exception. Every harness-based CLI's
``--in_process`` runs the points (and the machine's limits below) in the calling process instead, for tests
and debugging only: no process start-ups, but no cap and no isolated memory. :func:`sweep` runs a
benchmark's points in order and skips the rest of a series once one of its points failed.

Inside a point, :func:`measure` times a call (``warmup`` untimed calls, then ``repeats`` timed ones; tables
show the median) and reads its peak memory: the kernel's peak resident set size (VmHWM), reset just before
the first call, minus the resident size at that moment, i.e. what the calls need on top of what was already
allocated (inputs, parameters, imports).

The machine's limits are measured the same way, each in its own process: :func:`measure_sgemm_peak` (float32
matmul GFLOP/s) and :func:`measure_bandwidth` (GB/s of a large copy and of random row gathers).

The options every harness-based CLI shares come from :func:`benchmark_parser` (description, ``--preset``,
``--out``) and :func:`add_point_arguments`, ``--plugin`` included (:mod:`benchmarks.plugins`: modules that
register extra attention types, imported here and in every worker); :func:`fill_from_preset` fills what the
user left unset from the chosen preset.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.plugins import add_plugin_argument

PointFunction = Callable[[argparse.Namespace], dict]


# ---- memory ---------------------------------------------------------------------------------------------
def current_rss_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Make the kernel's peak-RSS counter (VmHWM) start again from the current size (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    """This process's peak resident set size since it started or since :func:`reset_peak_rss`."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # reported in kB


def cap_address_space(gib: float) -> None:
    """Cap this process's address space (0: no cap): an over-large point fails fast instead of swapping."""
    import resource

    if gib > 0:
        cap = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


# ---- time -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """What :func:`measure` read. Sizes in MiB.

    Attributes:
        times_s: seconds of each timed call.
        peak_mib: peak resident size during the calls minus ``base_mib``.
        base_mib: resident size just before the first call (inputs and parameters allocated).
        setup_peak_mib: the process's peak before the calls (imports, set-up, data).
    """

    times_s: list[float]
    peak_mib: float
    base_mib: float
    setup_peak_mib: float

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def fields(self) -> dict:
        """The fields every measured record shares: status "ok", median and all times, peak memory."""
        return {"status": "ok", "median_s": self.median_s, "times_s": self.times_s, "peak_mib": self.peak_mib}

    @property
    def process_peak_mib(self) -> float:
        """The whole process's peak: set-up or calls, whichever was larger."""
        return max(self.setup_peak_mib, self.base_mib + self.peak_mib)


def measure(call: Callable[[], object], warmup: int, repeats: int) -> Measurement:
    """Time ``call()`` (``warmup`` untimed calls, then ``repeats`` timed) and read its peak memory."""
    setup_peak = peak_rss_bytes()
    reset_peak_rss()  # so an earlier peak in this process (imports, set-up) cannot hide the calls' own
    base = current_rss_bytes()
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        call()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    mib = 2**20
    # The kernel syncs each thread's RSS count lazily, so for calls that allocate next to nothing the peak
    # can read a few pages below the base: that is 0 above it, not a negative need.
    peak = max(0, peak_rss_bytes() - base)
    return Measurement(times, peak / mib, base / mib, setup_peak / mib)


def measure_alternating(calls: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, list]:
    """Seconds of each of ``calls``'s ``repeats`` timed calls (after ``warmup`` untimed rounds), the calls
    taking turns (a, b, a, b, ...): a drift of the machine's speed, which on a shared machine moves a
    sub-second call's time by a fifth from one minute to the next, reaches every call alike, so the ratio of
    two medians holds steady where two points timed one after the other do not. No memory reading: the
    calls share the process."""
    times = {name: [] for name in calls}
    for i in range(warmup + repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def set_up_torch(threads: int, seed: int = 0) -> None:
    """What every point does first: its thread count and a fixed seed for its random inputs."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed)


# ---- command line ---------------------------------------------------------------------------------------
def benchmark_parser(doc: str, name: str, presets: dict | None = None) -> argparse.ArgumentParser:
    """A benchmark's parser: its module docstring as the description (kept as written), ``--out`` (default
    ``benchmarks/results/<name>``) and, given its ``presets``, ``--preset`` (default "full")."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if presets:
        parser.add_argument("--preset", choices=sorted(presets), default="full")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results") / name)
    return parser


def fill_from_preset(args: argparse.Namespace, preset: dict, **defaults) -> None:
    """Set every option the user left unset (None) to the preset's value, else to ``defaults``'; a dict
    (model sizes) is given as the JSON its option takes. Preset keys that are no option are left alone."""
    for name, value in {**defaults, **preset}.items():
        if getattr(args, name, False) is None:
            setattr(args, name, json.dumps(value) if isinstance(value, dict) else value)


def add_point_arguments(
    parser: argparse.ArgumentParser,
    *,
    threads: int = 2,
    memory_cap_gib: float = 16.0,
    timeout: float = 300.0,
    warmup: int | None = 1,
    plugins: bool = True,
) -> None:
    """The options of every harness-based CLI: threads, warm-up, per-point cap and timeout, (unless
    ``plugins`` is False: a benchmark whose types cannot come from plugins) ``--plugin``, and
    ``--in_process`` (:class:`ProcessOptions`)."""
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls before the timed ones")
    parser.add_argument(
        "--memory_cap_gib", type=float, default=memory_cap_gib, help="address-space cap per point (0: none)"
    )
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per point")
    if plugins:
        add_plugin_argument(parser)
    parser.add_argument(
        "--in_process",
        action="store_true",
        help="run every point in this process: tests and debugging only (no cap, allocator settings not "
        "applied, peak memory not the point's own: records say in_process)",
    )


# ---- one point, one process ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessOptions:
    """How each point's process runs (the CLI options of :func:`add_point_arguments`)."""

    threads: int
    timeout: float
    memory_cap_gib: float = 0.0
    plugins: tuple[str, ...] = ()
    in_process: bool = False  # tests and debugging: in the calling process (see launch)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProcessOptions:
        names = getattr(args, "plugin", [])
        plugins = tuple(str(Path(p).resolve()) if p.endswith(".py") else p for p in names)
        in_process = getattr(args, "in_process", False)
        return cls(args.threads, args.timeout, args.memory_cap_gib, plugins, in_process)


def launch(function: PointFunction, point: dict, base: dict, options: ProcessOptions) -> dict:
    """Measure one point with ``function`` in a fresh process, or with ``options.in_process`` in this one
    (as transformers' old benchmark's ``multi_process=False``: for tests and debugging): no address-space
    cap, no allocator setting (:func:`use_allocator` leaves this process's alone), the peak memory not the
    point's own (what earlier points and imports left is in it), and the record says ``"in_process": true``.

    Args:
        function: a module-level point function (the worker imports it by module and name).
        point: its settings, JSON values; the function gets them as attributes of a Namespace.
        base: the point's identity; a failure returns ``{**base, "status": why}``: "timeout", "out of
            memory" or "error", with the last line of the worker's stderr.
        options: threads, timeout, address-space cap and plugins of the worker.
    """
    if options.in_process:
        try:
            return {**function(argparse.Namespace(**point, in_process=True)), "in_process": True}
        except Exception as error:
            return {**base, "status": f"error: {type(error).__name__}: {error}"[:200], "in_process": True}
    module = function.__module__
    if module == "__main__":  # run as `python -m benchmarks.<name>`: the worker imports it by that name
        module = sys.modules["__main__"].__spec__.name
    cmd = [sys.executable, "-m", "benchmarks.worker", f"{module}:{function.__name__}"]
    cmd += ["--point", json.dumps(point), "--memory_cap_gib", str(options.memory_cap_gib)]
    for plugin in options.plugins:
        cmd += ["--plugin", plugin]
    env = _worker_env(options.threads)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=options.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout (> {options.timeout:g} s)"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        status = "out of memory" if "memory" in last.lower() or "alloc" in last.lower() else "error"
        return {**base, "status": f"{status}: {last[:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _worker_env(threads: int) -> dict[str, str]:
    """The worker's environment: ``threads`` OpenMP threads, and this very ``benchmarks`` package first on
    its import path (whatever the working directory)."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}


def launcher(function: PointFunction, args: argparse.Namespace, names: list[str]) -> Callable[[dict], dict]:
    """``run(base)`` for :func:`sweep`: :func:`launch` ``function`` at the point ``base`` with the
    options ``names`` of ``args`` (what every point of the run shares) added."""
    settings, options = {name: getattr(args, name) for name in names}, ProcessOptions.from_args(args)
    return lambda base: launch(function, {**settings, **base}, base, options)


def sweep(
    points: list[dict],
    run: Callable[[dict], dict],
    series: Callable[[dict], Hashable],
    *,
    desc: str,
    skipped: str = "skipped (failed at shorter n)",
    reason: Callable[[dict], str | None] = lambda point: None,
) -> list[dict]:
    """Run ``points`` in order (each a dict of the point's identity); one record each.

    Once a point of a series (``series(point)``, e.g. the type and mode) has failed, its later points are
    recorded as ``skipped`` without running: a longer sequence cannot succeed where a shorter one failed. A
    point for which ``reason(point)`` gives a status is recorded with it, not run.
    """
    from tqdm.auto import tqdm

    records, failed = [], set()
    with tqdm(points, desc=desc) as bar:
        for point in bar:
            # the point's scalar fields: a list (a batch's example ids) would fill the terminal
            label = " ".join(str(v) for v in point.values() if not isinstance(v, (list, tuple, dict)))
            bar.set_postfix_str(label)
            status = reason(point) or (skipped if series(point) in failed else None)
            if status is not None:
                records.append({**point, "status": status})
                continue
            record = run(point)
            if record["status"] != "ok":
                failed.add(series(point))
                bar.write(f"{label}: {record['status']}")
            records.append(record)
    return records


# ---- the machine ----------------------------------------------------------------------------------------
def machine_meta(threads: int) -> dict:
    """What every benchmark's results.json records about where it ran."""
    import torch

    return {
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": threads,
    }


def cpu_meta(args: argparse.Namespace) -> dict:
    """:func:`machine_meta` plus the timing settings of a float32 CPU benchmark (warm-up and repeats)."""
    timing = {"warmup": args.warmup, "repeats": args.repeats, "dtype": "float32", "device": "cpu"}
    return {**machine_meta(args.threads), **timing}


def package_version(name: str) -> str | None:
    """The installed version of a distribution (PyPI name), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def sgemm_point(point: argparse.Namespace) -> dict:
    """Point function: float32 matmul throughput, median GFLOP/s of ``point.size`` cubed products."""
    import torch

    set_up_torch(point.threads)
    size = point.size
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    timing = measure(lambda: torch.mm(a, b, out=out), warmup=1, repeats=5)
    return {
        "size": size,
        "threads": point.threads,
        "median_s": timing.median_s,
        "times_s": timing.times_s,
        "gflops": 2.0 * size**3 / timing.median_s / 1e9,
        "status": "ok",
    }


def measure_sgemm_peak(size: int, options: ProcessOptions) -> dict | None:
    """The machine's sgemm peak with the points' thread count, in a fresh process; None when ``size`` is 0
    or the measurement failed."""
    if size <= 0:
        return None
    sgemm = ProcessOptions(options.threads, options.timeout, in_process=options.in_process)  # a matmul only
    record = launch(sgemm_point, {"size": size, "threads": options.threads}, {"size": size}, sgemm)
    return {key: value for key, value in record.items() if key != "status"} if "gflops" in record else None


LEAN_MMAP_THRESHOLD = 16 * 2**20  # bytes: "lean" maps every block of 16 MiB and more on its own


def _mallopt(option: int, value: int, name: str) -> None:
    import ctypes

    if not ctypes.CDLL("libc.so.6").mallopt(option, value):
        raise RuntimeError(f"mallopt refused {name} = {value}")


def keep_freed_memory() -> None:
    """glibc: serve every allocation from the heap and keep freed memory for reuse (``mallopt``
    M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2^31 - 1), as the environment ``MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=2147483647`` would: tensors above 32 MiB then stop being mapped and page-faulted
    anew at every use."""
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    _mallopt(m_mmap_max, 0, "M_MMAP_MAX")
    _mallopt(m_trim_threshold, 2**31 - 1, "M_TRIM_THRESHOLD")


def map_large_blocks() -> None:
    """glibc: map every block of ``LEAN_MMAP_THRESHOLD`` bytes and more on its own and hand it back when
    freed (``mallopt`` M_MMAP_THRESHOLD, as ``MALLOC_MMAP_THRESHOLD_=16777216`` in the environment would).
    Setting the threshold also turns off glibc's dynamic one, which grows up to 32 MiB as large blocks are
    freed and then serves them from a heap that fragments and is not handed back: the resident size stays
    near what the live tensors need, and every large block is page-faulted in afresh."""
    m_mmap_threshold = -3  # glibc's malloc.h
    _mallopt(m_mmap_threshold, LEAN_MMAP_THRESHOLD, "M_MMAP_THRESHOLD")


# A point's allocator setting: its name and what sets it up (None: glibc's defaults).
ALLOCATORS = {"keep": keep_freed_memory, "glibc": None, "lean": map_large_blocks}


def use_allocator(point: argparse.Namespace) -> None:
    """Apply a point's ``allocator`` setting (one of :data:`ALLOCATORS`; glibc's defaults when it has none)
    before it allocates anything; not in a point run in the calling process (``launch``'s in_process): the
    setting would outlive the point there."""
    set_up = ALLOCATORS[getattr(point, "allocator", "glibc")]
    if set_up is not None and not getattr(point, "in_process", False):
        set_up()


def add_allocator_argument(parser: argparse.ArgumentParser, default: str = "glibc") -> None:
    """``--allocator``: the points' glibc setting (:data:`ALLOCATORS`, applied by :func:`use_allocator`)."""
    parser.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default=default,
        help=f"glibc's defaults, keep freed memory in the heap (no page faults above 32 MiB), or lean "
        f"(blocks of 16 MiB and more mapped on their own: less memory); default {default}; see "
        f"benchmarks.harness",
    )


def bandwidth_point(point: argparse.Namespace) -> dict:
    """Point function: the machine's memory bandwidth with ``point.threads`` threads: a copy of
    ``point.gib`` GiB (bytes read + written over the time: what streaming eager ops get), and a gather of
    random rows of 64 floats (256 bytes, the rows edge kernels read at a graph's sources) from a table of
    that size into a reused buffer, after the point's allocator setting (:func:`use_allocator`)."""
    import torch

    use_allocator(point)
    set_up_torch(point.threads)
    floats = int(point.gib * 2**30) // 4
    source, target = torch.ones(floats), torch.empty(floats)
    copy = measure(lambda: target.copy_(source), warmup=1, repeats=5)
    table = source.view(-1, 64)  # (rows, 64): 256-byte rows
    rows = torch.randint(0, table.shape[0], (2**20,))
    out = torch.empty(rows.numel(), 64)
    gather = measure(lambda: torch.index_select(table, 0, rows, out=out), warmup=1, repeats=5)
    return {
        "status": "ok",
        "threads": point.threads,
        "copy_gib": point.gib,
        "copy_gbps": 2 * floats * 4 / copy.median_s / 1e9,
        "table_gib": point.gib,
        "gather_gbps": rows.numel() * 256 / gather.median_s / 1e9,
    }


def measure_bandwidth(gib: float, options: ProcessOptions, allocator: str = "glibc") -> dict | None:
    """The machine's copy and gather bandwidth (:func:`bandwidth_point`) with the points' thread count, in
    a fresh process; None when ``gib`` is 0 or the measurement failed."""
    if gib <= 0:
        return None
    plain = ProcessOptions(options.threads, options.timeout, in_process=options.in_process)  # a copy only
    point = {"threads": options.threads, "gib": gib, "allocator": allocator}
    record = launch(bandwidth_point, point, {"gib": gib}, plain)
    return record if record["status"] == "ok" else None
