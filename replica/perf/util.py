"""Shared bits of the perf commands: a progress bar on a terminal, RSS, CPU time,
percentiles, the machine's page-cache write rate, the many-producer load loop, and
librdkafka's per-record loop."""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..client import Client, ClientSecurity


class Progress:
    """A bar on stderr when it is a terminal. ``heartbeat_s``: otherwise (a log, a CI job)
    a plain line every that many seconds, so a slow phase still says where it is."""

    def __init__(self, total: float, label: str, *, heartbeat_s: float | None = None) -> None:
        self.total = total
        self.label = label
        self.enabled = sys.stderr.isatty()
        self.heartbeat_s = heartbeat_s
        self.start = time.monotonic()
        self._last = 0.0
        self._last_beat = self.start

    def update(self, done: float, detail: str = "") -> None:
        now = time.monotonic()
        if not self.enabled:
            if self.heartbeat_s is not None and now - self._last_beat >= self.heartbeat_s:
                self._last_beat = now
                note = f" {detail}" if detail else ""
                sys.stderr.write(f"{self.label}: {now - self.start:.1f}s{note}\n")
                sys.stderr.flush()
            return
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total) if self.total else 1.0
        bar = "#" * int(frac * 30)
        note = f" {detail}" if detail else ""
        sys.stderr.write(
            f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {now - self.start:6.1f}s{note}\x1b[K"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process, in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a live process has used so far, all its threads: read
    from its CPU-time clock, to the nanosecond; where that clock cannot be read, from
    /proc/<pid>/stat, in clock ticks (10 ms here: a short measure of a process that did
    little there may read 0)."""
    try:
        return time.clock_gettime(_process_cpu_clock(pid))
    except OSError:
        fields = _stat_fields(pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu_clock(pid: int) -> int:
    """Linux's clock id for a process's CPU time (clock_getcpuclockid(3)): the bitwise
    complement of the pid, shifted by 3, with CPUCLOCK_SCHED (2), process-wide."""
    return ((~pid) << 3) | 2


@dataclass(frozen=True, slots=True)
class MachineCpu:
    """The machine's CPU time since boot over all its CPUs, in clock ticks, from the
    first line of /proc/stat: ``steal`` is the time a virtual machine's CPUs were ready to
    run while its host ran something else (the share of the machine a benchmark did not
    get), ``idle`` the time no process wanted them (idle and iowait), ``total`` every
    state's time. All 0 where /proc/stat cannot be read."""

    steal: int = 0
    total: int = 0
    idle: int = 0

    @classmethod
    def now(cls) -> MachineCpu:
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()
        except OSError:
            return cls()
        # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest
        # time is counted in user's already.
        ticks = [int(v) for v in fields[1:9]]
        return cls(ticks[7] if len(ticks) > 7 else 0, sum(ticks), sum(ticks[3:5]))

    def steal_share_since(self, earlier: MachineCpu) -> float:
        """The share of the machine's CPU time the host took since ``earlier`` (0.0 to
        1.0; 0.0 when no time was counted)."""
        total = self.total - earlier.total
        return (self.steal - earlier.steal) / total if total > 0 else 0.0

    def busy_share_since(self, earlier: MachineCpu) -> float:
        """The share of the machine's CPU time something ran in since ``earlier`` (0.0 to
        1.0): near 1.0, the CPUs bound a figure measured meanwhile, whatever its code."""
        total = self.total - earlier.total
        return 1.0 - (self.idle - earlier.idle) / total if total > 0 else 0.0


def minor_faults(pid: int) -> int:
    """Page faults a live process has taken so far without I/O (minflt: a fresh page
    mapped and zeroed, most often), from /proc/<pid>/stat."""
    return int(_stat_fields(pid)[7])


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on: the command name before it may hold
    spaces. Field n of man 5 proc is at index n - 3 (minflt 10, utime 14, stime 15)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2 :].split()


def add_page_cache_option(ap: Any) -> None:
    """``--page-cache``: the nodes' ``serve --page-cache`` (``page_cache_args(args)``)."""
    ap.add_argument(
        "--page-cache",
        choices=("keep", "drop"),
        default="keep",
        help="the nodes' serve --page-cache (drop: synced pages leave the page cache)",
    )


def page_cache_args(args: Any) -> list[str]:
    """The node arguments of ``--page-cache``."""
    return ["--page-cache", args.page_cache]


def page_cache_write_mb_per_s(directory: str | os.PathLike[str], mb: int = 256) -> float:
    """How fast this machine takes writes into a new file in ``directory`` (1 MiB at a
    time, no fsync): the page-cache copy every replica's append pays. On a virtual
    machine whose host takes back the memory it frees, new pages cost a first touch
    (several times the cost of reused ones), so this varies with the machine's state."""
    path = os.path.join(directory, f".page-cache-probe-{os.getpid()}")
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        start = time.monotonic()
        for _ in range(mb):
            os.write(fd, chunk)
        elapsed = time.monotonic() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return mb * (1 << 20) / 1e6 / elapsed if elapsed > 0 else 0.0


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def emit(figures: dict[str, Any], lines: list[str]) -> None:
    for line in lines:
        print(line)
    print(json.dumps(figures, sort_keys=True))


#: Records between two ``poll(0)`` calls of librdkafka's per-record loop (its delivery
#: reports).
POLL_EVERY = 1_000
#: How long librdkafka's per-record loop may take to hand over its records (a full queue
#: is waited out, delivery by delivery) before the run fails.
QUEUE_WAIT_S = 300.0


def librdkafka_loop(
    producer: Any,
    topic: str,
    records: int,
    values: list[bytes],
    keys: list[bytes] | None,
    progress: Progress,
    what: str,
) -> None:
    """The per-record loop Kafka users write: confluent-kafka's ``produce(topic, value,
    key)`` for each record (``partition=0`` without ``keys``; the values in turn), with no
    callback of its own (the producer's ``on_delivery`` with ``delivery.report.only.error``
    reports failures: a callback passed with each record costs this client ~0.5-1 us of
    CPU a record even when only errors are reported), ``poll(0)`` every ``POLL_EVERY``
    records; a full queue is drained by deliveries before the record goes again, for at
    most ``QUEUE_WAIT_S`` in all (``what`` names the run in the error)."""
    produce, poll = producer.produce, producer.poll
    deadline = time.monotonic() + QUEUE_WAIT_S
    count = len(values)
    for i in range(records):
        value = values[i % count]
        while True:
            try:
                if keys is None:
                    produce(topic, value, partition=0)
                else:
                    produce(topic, value, keys[i])
                break
            except BufferError:  # its queue is full: let deliveries drain it
                poll(0.005)
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"{what}: {i:,} of {records:,} records handed over in {QUEUE_WAIT_S:g} s"
                    ) from None
        if not i % POLL_EVERY:
            poll(0)
            if not i % 100_000:
                progress.update(i)


# How the many-producer load runs: threads of this process (one GIL for every producer's
# client work) or one process per producer (the clients' CPU spread over the cores).
PRODUCER_MODES = ("threads", "processes")


@dataclass(frozen=True, slots=True)
class ProduceJob:
    bootstrap: str
    topic: str
    partitions: tuple[int, ...]
    payload: bytes  # one encoded batch (storage.records.encode_batch)
    batch_records: int
    duration_s: float = 0.0  # run this long, or else
    total_batches: int = 0  # until this many batches are sent over all producers
    security: ClientSecurity | None = None
    # Batches each producer has in flight, for as many partitions (one per partition, so
    # each partition's stay in order, as Producer keeps them): sent by produce_many, every
    # leader's at once. 1: one produce at a time.
    in_flight: int = 1
    # Each producer sends at most this many batches a second (0: as fast as acknowledged).
    batches_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ProduceLoad:
    records: int  # acknowledged
    seconds: float  # from the moment every producer was connected until the last finished
    mode: str
    # CPU time the producers used while producing, over ``seconds`` (their threads', or
    # their processes'): near 100 % in threads mode means one GIL bounds the figure.
    client_cpu_pct: float = 0.0

    @property
    def rate(self) -> float:
        """Acknowledged records a second (0 when no time was measured)."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


class _Cell:
    def __init__(self, value: float = 0) -> None:
        self.value = value


@dataclass(frozen=True, slots=True)
class _Shared:
    """What the producers share: batches claimed, records acknowledged, CPU seconds
    spent producing, producers done, when the first of them (or the parent) passed the
    start barrier and when the last one ended (time.monotonic, one clock for every
    process on Linux); ``multiprocessing`` values between processes."""

    claimed: Any
    records: Any
    cpu: Any
    done: Any
    started: Any
    ended: Any
    lock: Any

    def start(self) -> float:
        """The clock's start, the same for every producer and the parent: the moment the
        first of them passed the barrier (each may be woken a few ms apart, and a
        producer's duration counted from its own waking could end before the parent's
        start plus that duration)."""
        with self.lock:
            if not self.started.value:
                self.started.value = time.monotonic()
            return float(self.started.value)


def _produce_loop(c: Client, idx: int, job: ProduceJob, shared: _Shared, clock: Any) -> None:
    start = shared.start()
    cpu0 = clock()
    try:
        _produce_batches(c, idx, job, start, shared.claimed, shared.records, shared.lock)
    finally:
        with shared.lock:
            shared.cpu.value += clock() - cpu0
            shared.done.value += 1
            shared.ended.value = max(shared.ended.value, time.monotonic())


def _produce_batches(
    c: Client, idx: int, job: ProduceJob, start: float, claimed: Any, records: Any, lock: Any
) -> None:
    """Producer ``idx``: acks=quorum batches to the job's partitions in turn from the
    ``idx``-th, ``job.in_flight`` partitions at a time, at most ``job.batches_per_s``,
    until the job's duration (from ``start``) or batch budget is spent. The first failure
    of any batch is raised."""
    deadline = start + job.duration_s if job.duration_s else None
    parts = job.partitions
    width = max(1, min(job.in_flight, len(parts)))
    i = idx
    sent = 0
    while True:
        if job.batches_per_s:
            due = start + sent / job.batches_per_s
            if deadline is not None:
                due = min(due, deadline)
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        n = width
        if job.total_batches:
            with lock:
                n = min(width, job.total_batches - claimed.value)
                if n <= 0:
                    return
                claimed.value += n
        if deadline is not None and time.monotonic() >= deadline:
            return
        if n == 1:
            c.produce(job.topic, parts[i % len(parts)], job.payload)
        else:
            items = [(job.topic, parts[(i + k) % len(parts)], job.payload) for k in range(n)]
            for result in c.produce_many(items):
                if isinstance(result, Exception):
                    raise result
        i += n
        sent += n
        with lock:
            records.value += n * job.batch_records


def _connected(job: ProduceJob) -> Client:
    c = Client(job.bootstrap, security=job.security)
    try:
        # The leaders of the partitions it writes, known before the clock starts (asking
        # for the whole topic would cost every node ~0.2 s per 10,000 partitions, per
        # producer, at the start of the measure).
        c.metadata([job.topic], partitions=list(job.partitions))
    except BaseException:
        c.close()
        raise
    return c


def _thread_producer(
    idx: int,
    job: ProduceJob,
    ready: threading.Barrier,
    shared: _Shared,
    errors: list[BaseException],
) -> None:
    try:
        with _connected(job) as c:
            ready.wait()
            _produce_loop(c, idx, job, shared, time.thread_time)
    except BaseException as exc:  # reported after the run
        errors.append(exc)
        ready.abort()


def _process_producer(idx: int, job: ProduceJob, ready: Any, shared: _Shared, errors: Any) -> None:
    try:
        with _connected(job) as c:
            ready.wait()
            _produce_loop(c, idx, job, shared, time.process_time)
    except BaseException as exc:  # the parent raises it
        errors.put(f"producer {idx}: {type(exc).__name__}: {exc}")
        ready.abort()


def run_producers(
    job: ProduceJob,
    producers: int,
    *,
    mode: str = "threads",
    label: str = "produce",
    start_timeout_s: float = 120.0,
) -> ProduceLoad:
    """``producers`` producers, each with its own Client (connection), sending the job's
    batch with acks=quorum, producer i starting at the job's i-th partition and going
    round-robin. The clock starts once every producer is connected and knows the leaders;
    records count when acknowledged."""
    if mode not in PRODUCER_MODES:
        raise ValueError(f"producer mode must be one of {PRODUCER_MODES}, got {mode!r}")
    if not job.partitions:
        raise ValueError("a produce job needs at least one partition")
    total = job.duration_s or job.total_batches * job.batch_records
    progress = Progress(total, label, heartbeat_s=10)
    workers: list[Any]
    if mode == "threads":
        shared = _Shared(_Cell(), _Cell(), _Cell(), _Cell(), _Cell(), _Cell(), threading.Lock())
        errors: list[BaseException] = []
        ready = threading.Barrier(producers + 1)
        workers = [
            threading.Thread(
                target=_thread_producer,
                args=(i, job, ready, shared, errors),
                daemon=True,
            )
            for i in range(producers)
        ]
    else:
        # spawn, not fork: this process has threads (the client's metadata pool).
        ctx = multiprocessing.get_context("spawn")
        shared = _Shared(
            ctx.Value("q", 0, lock=False),
            ctx.Value("q", 0, lock=False),
            ctx.Value("d", 0.0, lock=False),
            ctx.Value("q", 0, lock=False),
            ctx.Value("d", 0.0, lock=False),
            ctx.Value("d", 0.0, lock=False),
            ctx.Lock(),
        )
        queue = ctx.Queue()
        ready = ctx.Barrier(producers + 1)
        workers = [
            ctx.Process(
                target=_process_producer,
                args=(i, job, ready, shared, queue),
                daemon=True,
            )
            for i in range(producers)
        ]
    for w in workers:
        w.start()
    try:
        try:
            ready.wait(start_timeout_s)
        except threading.BrokenBarrierError:
            pass  # a producer failed to connect: its error is raised below
        start = shared.start()
        # Until every producer has finished producing (a process then still takes a while
        # to exit, which is not producing time).
        while shared.done.value < producers and any(w.is_alive() for w in workers):
            records = shared.records.value
            done = time.monotonic() - start if job.duration_s else records
            progress.update(done, f"{records:,} records")
            time.sleep(0.05)
        elapsed = (shared.ended.value if shared.ended.value > start else time.monotonic()) - start
    finally:
        progress.close()
        for w in workers:
            w.join(timeout=30)
    if mode == "threads":
        if errors:
            raise errors[0]
    else:
        failures = []
        while not queue.empty():
            failures.append(queue.get())
        if failures:
            raise RuntimeError("; ".join(failures))
    pct = round(shared.cpu.value / elapsed * 100, 1) if elapsed > 0 else 0.0
    return ProduceLoad(int(shared.records.value), elapsed, mode, pct)
