"""What bench/run.sh and bench/audit_rss.sh measure, in one place.

The scripts start and stop the processes (servers, the connector,
pg_recvlogical, pgbench, Kafka Connect); everything read from them is read
here: /proc (CPU ticks, peak RSS, threads), the connector's /metrics, the
server through psql, elapsed times and rates, and each phase's JSON fragment.

Standard library only (audit_rss.sh runs it with the system python3); the
Kafka client is imported by the one watcher that counts records on a topic.

Conventions kept from the shell version, so that results stay comparable:
CPU seconds are user + system of all threads, rounded to 0.01 s; peak RSS is
VmHWM in MiB rounded to 0.1; a process that is gone reads as 0; elapsed times
are rounded to 1 ms and rates to whole events per second.
"""

import datetime
import glob
import http.client
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    """A phase could not be measured; the message says why (and what the log said)."""


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def load_json(path):
    with open(path) as f:
        return json.load(f)


# --- numbers -------------------------------------------------------------------


def epoch(stamp):
    """A start time as the scripts record it: bash's $EPOCHREALTIME (the decimal
    separator follows the locale)."""
    return float(str(stamp).replace(",", "."))


def elapsed(t0, t1):
    return round(t1 - t0, 3)


def rate(n, seconds):
    return round(n / seconds) if seconds > 0 else 0


def parse_lsn(text):
    """PostgreSQL's X/Y notation as a number (the two halves of 64 bits)."""
    hi, lo = text.strip().split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


# --- /proc -----------------------------------------------------------------------


def _stat_fields(path):
    """Fields of a /proc stat file after the command name (which may hold spaces):
    [0] is the state, [11] utime, [12] stime (clock ticks)."""
    with open(path) as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()


def alive(pid):
    """Running (a zombie has exited: its parent has only not reaped it yet)."""
    try:
        return _stat_fields(f"/proc/{pid}/stat")[0] != "Z"
    except (OSError, ValueError):
        return False


def cpu_s(pid):
    """CPU seconds (user + system, all threads) a process has used so far; 0 when gone."""
    if not pid:
        return 0.0
    try:
        f = _stat_fields(f"/proc/{pid}/stat")
    except (OSError, ValueError):
        return 0.0
    return round((int(f[11]) + int(f[12])) / CLK_TCK, 2)


def _status_field(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split()[1:]
    except OSError:
        pass
    return None


def peak_rss_kib(pid):
    """VmHWM, the kernel's peak RSS of the process; 0 when gone."""
    v = _status_field(pid, "VmHWM") if pid else None
    return int(v[0]) if v else 0


def peak_rss_mib(pid):
    return round(peak_rss_kib(pid) / 1024, 1)


def thread_stats(pid):
    """Per-thread CPU seconds and context switches, one bucket per kind of
    thread (rdk:broker1 / sled-io-3: the name up to its first digit)."""
    cpu, switches = {}, {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().rstrip("\n")
            fields = _stat_fields(f"{task}/stat")
            with open(f"{task}/status") as f:
                ctx = sum(int(l.split()[1]) for l in f if "ctxt_switches" in l)
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        name = re.split(r"[0-9]", re.sub(r"[^A-Za-z0-9:_-]", "_", name), maxsplit=1)[0]
        cpu[name] = cpu.get(name, 0) + int(fields[11]) + int(fields[12])
        switches[name] = switches.get(name, 0) + ctx
    return {n: {"cpu_s": round(cpu[n] / CLK_TCK, 2), "context_switches": switches[n]} for n in cpu}


def log_tail(path, n=5, pattern=None):
    """The last n lines of a log (or its first n lines matching pattern), for error messages."""
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    if pattern:
        return " | ".join([l for l in lines if re.search(pattern, l)][:n])
    return " | ".join(lines[-n:])


# --- the connector's /metrics -------------------------------------------------------


def scrape(url, timeout=2.0):
    """The text of a Prometheus endpoint, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except (OSError, http.client.HTTPException):
        return None


def samples(text):
    """Unlabelled samples of a Prometheus text page: {name: number}."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#" or "{" in line:
            continue
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                out[parts[0]] = float(parts[1])
    return out


# --- PostgreSQL, through psql ----------------------------------------------------------


def psql(url, query):
    cmd = [os.environ.get("BENCH_PSQL", "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", query]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failed(f"psql: {r.stderr.strip()}")
    return r.stdout.strip()


def slot_pid(url, slot):
    """The walsender serving a slot, 0 while none does."""
    if not (url and slot):
        return 0
    try:
        return int(psql(url, f"SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = '{slot}'") or 0)
    except Failed:
        return 0


# --- versions ---------------------------------------------------------------------------


def _out(*cmd, stderr=False):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (r.stderr if stderr else r.stdout).strip()
    return text or None


def kafka_version(classpath):
    m = re.search(r"kafka-([0-9][0-9.]*[0-9])", classpath or "")
    return m.group(1) if m else "unknown"


def librdkafka_version(cargo_lock="Cargo.lock"):
    """The librdkafka the connector links: rdkafka-sys builds it from source,
    its version is the part after `+` of the crate's version."""
    try:
        with open(cargo_lock) as f:
            m = re.search(r'name = "rdkafka-sys"\nversion = "([^"]+)"', f.read())
    except OSError:
        return None
    if not m:
        return None
    crate = m.group(1)
    return f"{crate.split('+', 1)[1]} (rdkafka-sys {crate}, built from source)" if "+" in crate else f"rdkafka-sys {crate}"


def jar_version(jars_dir, artifact):
    """The version of ARTIFACT among Maven-resolved jars (artifact-<version>.jar)."""
    for path in sorted(glob.glob(os.path.join(jars_dir or "", f"{artifact}-[0-9]*.jar"))):
        return os.path.basename(path)[len(artifact) + 1: -len(".jar")]
    return None


def machine_facts(note, admin_url, kafka_classpath, pg_bin, java, debezium_jars=None):
    """The machine and every version a run used (a later reader must be able to
    tell which software produced a figure)."""

    def first(path, key):
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()

    mem_kib = int(first("/proc/meminfo", "MemTotal").split()[0])
    pg_version = psql(admin_url, "SHOW server_version")
    java_version = _out(java, "-version", stderr=True)
    try:
        import confluent_kafka  # the bench's consumer (run.sh's venv); not needed by audit_rss.sh

        consumer = f"confluent-kafka {confluent_kafka.version()}, librdkafka {confluent_kafka.libversion()[0]}"
    except ImportError:
        consumer = None
    versions = {
        "outbox_cdc_git_commit": _out("git", "rev-parse", "HEAD"),
        "outbox_cdc_git_dirty": bool(_out("git", "status", "--porcelain", "--untracked-files=no")),
        "postgresql_server": pg_version,
        "pg_recvlogical": _out(os.path.join(pg_bin, "pg_recvlogical"), "--version"),
        "pgbench": _out(os.path.join(pg_bin, "pgbench"), "--version"),
        "kafka": kafka_version(kafka_classpath),
        "librdkafka": librdkafka_version(),
        "java": java_version.splitlines()[0] if java_version else None,
        "debezium": jar_version(debezium_jars, "debezium-connector-postgres"),
        "kafka_connect": jar_version(debezium_jars, "connect-runtime"),
        "rustc": _out("rustc", "--version"),
        "python": platform.python_version(),
        "bench_consumer": consumer,
    }
    return {
        "nproc": os.cpu_count(),
        "cpu_model": first("/proc/cpuinfo", "model name"),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "postgresql": pg_version,
        "kafka": versions["kafka"],
        "rustc": versions["rustc"],
        "git_commit": _out("git", "rev-parse", "--short", "HEAD"),
        "git_dirty": versions["outbox_cdc_git_dirty"],
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions,
        "note": note,
    }


# --- phases -----------------------------------------------------------------------------


def backlog(db_url, start_lsn, end_lsn, started, ended, events, tx, label):
    """A written backlog: its rows counted, its WAL and write time. The caller
    reads the end position as soon as the writers are done: WAL written after
    the last commit (autovacuum, the bgwriter's running-xacts record) can only
    be acknowledged on an idle keepalive, up to wal_sender_timeout / 2 later."""
    count = int(psql(db_url, "SELECT count(*) FROM public.outbox_events"))
    if count != events:
        raise Failed(f"the backlog is {count} rows, not {events}")
    wal_bytes = parse_lsn(end_lsn) - parse_lsn(start_lsn)
    write_s = elapsed(started, ended)
    log(f"{label}: backlog written in {write_s}s ({rate(events, write_s)} events/s), "
        f"WAL {start_lsn}..{end_lsn} ({wal_bytes} bytes)")
    return {"tx_size": tx, "events": events, "wal_bytes": wal_bytes, "write_seconds": write_s}


def watch_recvlogical(pid, slot, db_url, started, timeout, time_file, events, label):
    """pg_recvlogical (run under /usr/bin/time -f '%M %U %S') until it exits at
    its end position. Its walsender exits with it: its last CPU reading is kept."""
    deadline = time.monotonic() + timeout
    wpid, wcpu = 0, 0.0
    while alive(pid):
        if time.monotonic() > deadline:
            raise Failed(f"pg_recvlogical did not reach its end position within {timeout}s")
        if not wpid:
            wpid = slot_pid(db_url, slot)
        if wpid:
            wcpu = cpu_s(wpid) or wcpu
        time.sleep(0.05)
    t1 = time.time()
    rss_kib, user, system = 0, 0.0, 0.0
    try:
        with open(time_file) as f:
            # The format's line is the last (a failing command adds one before it).
            rss, user, system = f.read().split("\n")[-2].split()
            rss_kib, user, system = int(rss), float(user), float(system)
    except (OSError, ValueError, IndexError):
        pass
    s = elapsed(started, t1)
    log(f"{label}: pg_recvlogical {s}s → {rate(events, s)} events/s")
    return {
        "pg_recvlogical_seconds": s,
        "pg_recvlogical_events_per_s": rate(events, s),
        "pg_recvlogical_peak_rss_mib": round(rss_kib / 1024, 1),
        "pg_recvlogical_cpu_s": round(user + system, 2),
        "pg_recvlogical_walsender_cpu_s": wcpu,
    }


def wait_lsn(pid, metrics_url, end_lsn, events, started, timeout, label, log_path=None,
             slot=None, db_url=None, kpid=0, threads=True, expect_published=0, expect_checked=0,
             hold_until=0.0):
    """The connector until /metrics' outbox_cdc_acked_lsn (persisted and reported
    to PostgreSQL) reaches end_lsn; then what it, its walsender and the broker used.
    hold_until > 0: the connector also runs until that many seconds after the
    start, and its CPU then is connector_cpu_s_held (a variant without the live
    witness read at the time another variant's witness finished checking)."""
    end = parse_lsn(end_lsn)
    k0 = cpu_s(kpid)
    deadline = time.monotonic() + timeout
    pub_t = ack_t = None
    wpid = 0
    m = {}
    while True:
        if not alive(pid):
            raise Failed(f"the connector exited: {log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise Failed(f"the connector did not reach {end_lsn} within {timeout}s")
        text = scrape(metrics_url)
        if text is not None:
            m = samples(text)
            if pub_t is None and m.get("outbox_cdc_events_published_total", 0) >= events:
                pub_t = time.time()
            if not wpid:
                wpid = slot_pid(db_url, slot)
            if m.get("outbox_cdc_acked_lsn", 0) >= end:
                ack_t = time.time()
                break
        time.sleep(0.1)
    rss = peak_rss_mib(pid)
    res = {
        "connector_seconds": elapsed(started, ack_t),
        "connector_events_per_s": rate(events, elapsed(started, ack_t)),
        "connector_all_published_seconds": elapsed(started, pub_t or ack_t),
        "connector_cpu_s": cpu_s(pid),
        "connector_walsender_cpu_s": cpu_s(wpid),
        "kafka_broker_cpu_s": round(cpu_s(kpid) - k0, 2),
    }
    if threads:
        res["connector_threads"] = thread_stats(pid)
    res.update({
        "peak_rss_mib": rss,
        "peak_rss_kib": peak_rss_kib(pid),
        "connector_published_events": int(m.get("outbox_cdc_events_published_total", 0)),
        "connector_sequence_gaps": int(m.get("outbox_cdc_sequence_gaps_total", 0)),
    })
    if res["connector_published_events"] < expect_published:
        raise Failed(f"the connector published {res['connector_published_events']} events, "
                     f"fewer than {expect_published}")
    if expect_checked:
        # The live witness checks the drained rows in its rounds after they
        # were acknowledged: until it has checked them all, and the
        # connector's CPU then (its CPU at the acknowledgement stays above).
        checked_t = None
        while time.monotonic() < deadline and alive(pid):
            m = samples(scrape(metrics_url) or "")
            if m.get("outbox_cdc_reconcile_checked_rows_total", 0) >= expect_checked:
                checked_t = time.time()
                break
            time.sleep(0.1)
        if checked_t is None:
            raise Failed(f"the live witness did not check {expect_checked} rows within {timeout}s")
        res.update({
            "witness_checked_rows": int(m.get("outbox_cdc_reconcile_checked_rows_total", 0)),
            "witness_missing_rows": int(m.get("outbox_cdc_reconcile_missing_total", 0)),
            "witness_checked_seconds": elapsed(started, checked_t),
            "connector_cpu_s_checked": cpu_s(pid),
        })
        log(f"{label}: the live witness checked {res['witness_checked_rows']} rows "
            f"({res['witness_missing_rows']} missing) {res['witness_checked_seconds']}s after the start; "
            f"connector CPU s then {res['connector_cpu_s_checked']}")
    if hold_until > 0:
        while elapsed(started, time.time()) < hold_until and alive(pid):
            time.sleep(0.05)
        res.update({
            "held_seconds": elapsed(started, time.time()),
            "connector_cpu_s_held": cpu_s(pid),
        })
        log(f"{label}: held until {res['held_seconds']}s after the start; connector CPU s then "
            f"{res['connector_cpu_s_held']}")
    log(f"{label}: outbox-cdc {res['connector_seconds']}s → {res['connector_events_per_s']} events/s "
        f"(all published after {res['connector_all_published_seconds']}s), peak RSS {rss} MiB")
    log(f"{label}: CPU s: connector {res['connector_cpu_s']} + its walsender {res['connector_walsender_cpu_s']}"
        + (f" + Kafka broker {res['kafka_broker_cpu_s']}" if kpid else "")
        + (f"; connector threads {json.dumps(res['connector_threads'])}" if threads else ""))
    return res


def wait_metric(pid, metrics_url, name, at_least, timeout, log_path=None, slot=None, db_url=None):
    """Until a /metrics sample reaches a value (and, given a slot, the slot is active)."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive(pid):
            raise Failed(f"the connector exited: {log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise Failed(f"{name} did not reach {at_least} within {timeout}s: {log_tail(log_path)}")
        text = scrape(metrics_url)
        if text is not None and samples(text).get(name, 0) >= at_least:
            if not slot or slot_pid(db_url, slot):
                return
        time.sleep(0.1)


def watch_floor(pid, stdout_path, timeout, tx, label, log_path=None, kpid=0):
    """examples/produce_floor until it prints its JSON line (it then waits for
    SIGTERM so that its CPU time and peak RSS can still be read)."""
    k0 = cpu_s(kpid)
    deadline = time.monotonic() + timeout
    line = ""
    while not line:
        if not alive(pid):
            raise Failed(f"produce_floor exited: {log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise Failed(f"produce_floor did not finish within {timeout}s")
        time.sleep(0.1)
        with open(stdout_path) as f:
            line = f.readline().strip()
    r = json.loads(line)
    r.update(tx_size=tx, cpu_s=cpu_s(pid), peak_rss_mib=peak_rss_mib(pid),
             kafka_broker_cpu_s=round(cpu_s(kpid) - k0, 2), measured=True)
    log(f"{label}: {line}, CPU s {r['cpu_s']} + Kafka broker {r['kafka_broker_cpu_s']}, "
        f"peak RSS {r['peak_rss_mib']} MiB")
    return r


def _connect_failure(connect_url):
    """Why Kafka Connect's connector or task failed, from its REST API; None while they run."""
    if not connect_url:
        return None
    text = scrape(f"{connect_url}/connectors/bench-debezium/status")
    if not text:
        return None
    try:
        status = json.loads(text)
    except ValueError:
        return None
    for part in [status.get("connector", {})] + status.get("tasks", []):
        if part.get("state") == "FAILED":
            return (part.get("trace") or "FAILED").splitlines()[0]
    return None


def watch_peer(pid, bootstrap, topic, events, started, timeout, slot, db_url, label,
               log_path=None, connect_url=None):
    """Debezium (Kafka Connect standalone) until TOPIC holds every event; records
    counted by the sum of its partitions' end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-end-offsets", "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    cpu = rss = 0.0
    n = 0
    try:
        while True:
            if not alive(pid):
                raise Failed(f"Kafka Connect exited with {n} of {events} records on the topic: "
                             f"{log_tail(log_path, 3, 'ERROR|Exception')}")
            why = _connect_failure(connect_url)
            if why:
                raise Failed(f"the Debezium connector failed with {n} of {events} records on the topic: {why}")
            if time.monotonic() > deadline:
                raise Failed(f"Debezium did not deliver {events} records within {timeout}s ({n} so far)")
            cpu = cpu_s(pid) or cpu
            rss = peak_rss_mib(pid) or rss
            try:
                parts = consumer.list_topics(topic, timeout=5).topics[topic].partitions
                n = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in parts)
            except Exception:
                pass  # asked again next round
            if n >= events:
                break
            time.sleep(0.5)
    finally:
        consumer.close()
    t1 = time.time()
    cpu = cpu_s(pid) or cpu
    rss = peak_rss_mib(pid) or rss
    wcpu = cpu_s(slot_pid(db_url, slot))
    s = elapsed(started, t1)
    log(f"{label}: {s}s → {rate(events, s)} events/s, CPU s {cpu} (its walsender {wcpu}), peak RSS {rss} MiB")
    return {"records": n, "seconds": s, "events_per_s": rate(events, s), "cpu_s": cpu,
            "walsender_cpu_s": wcpu, "peak_rss_mib": rss}


def watch_steady(pid, db_url, latency_path, timeout, metrics_url, metrics_out, pgbench_log, label, log_path=None):
    """After pgbench: until the consumer has read every event (or TIMEOUT), then
    the connector's /metrics and peak RSS, and pgbench's rate."""
    events = int(psql(db_url, "SELECT count(*) FROM public.outbox_events"))
    tps = 0.0
    with open(pgbench_log) as f:
        m = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", f.read(), re.M)
        if m:
            tps = float(m.group(1))
    log(f"{label}: pgbench {tps} tps, {events} events; waiting for the consumer to read them all")
    deadline = time.monotonic() + timeout
    read, pos = 0, 0
    while True:
        with open(latency_path, "rb") as f:
            f.seek(pos)
            chunk = f.read()
        # Count whole lines only: the consumer may be half-way through one.
        cut = chunk.rfind(b"\n") + 1
        read += chunk.count(b"\n", 0, cut)
        pos += cut
        if read >= events:
            break
        if not alive(pid):
            raise Failed(f"the connector exited: {log_tail(log_path, 3)}")
        if time.monotonic() > deadline:
            log(f"warning: the consumer read {read} of {events} events in {timeout} s")
            break
        time.sleep(0.5)
    text = scrape(metrics_url, timeout=5)
    if text is None:
        raise Failed(f"{metrics_url} did not answer")
    with open(metrics_out, "w") as f:
        f.write(text)
    return {"tps": tps, "events": events, "peak_rss_mib": peak_rss_mib(pid)}


def _time_v(path):
    """The figures of GNU time's -v report."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().rpartition(": ")
            if key == "Maximum resident set size (kbytes)":
                out["peak_rss_kib"] = int(value)
            elif key.startswith("Elapsed (wall clock) time"):
                wall = 0.0
                for part in value.split(":"):
                    wall = wall * 60 + float(part)
                out["wall_seconds"] = round(wall, 2)
            elif key == "User time (seconds)":
                out["user_cpu_seconds"] = float(value)
            elif key == "System time (seconds)":
                out["system_cpu_seconds"] = float(value)
    return out


def _child(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else 0
    except OSError:
        return 0


def run_measured(cmd, timeout, stdout_path, stderr_path):
    """Runs CMD to its end under /usr/bin/time -v: peak RSS (the kernel's
    ru_maxrss of CMD), CPU seconds, wall time, exit status. VmHWM of CMD is
    polled meanwhile as a cross-check, and is the figure where /usr/bin/time
    is missing. (A child forked from this Python would report Python's own
    RSS as its peak: the maximum survives exec.)"""
    time_file = stdout_path + ".time"
    timed = os.access("/usr/bin/time", os.X_OK)
    argv = ["/usr/bin/time", "-v", "-o", time_file] + cmd if timed else cmd
    t0 = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
    polled, target, ticks = 0, 0 if timed else proc.pid, (0, 0)
    while proc.poll() is None:
        if time.monotonic() - t0 > timeout:
            proc.kill()
            proc.wait()
            raise Failed(f"{os.path.basename(cmd[0])} did not finish within {timeout}s")
        target = target or _child(proc.pid)
        if target:
            polled = max(polled, peak_rss_kib(target))
            try:
                f = _stat_fields(f"/proc/{target}/stat")
                ticks = (int(f[11]), int(f[12]))
            except (OSError, ValueError):
                pass
        time.sleep(0.02)
    res = {
        "peak_rss_kib": polled,
        "peak_rss_kib_polled": polled,
        "wall_seconds": round(time.monotonic() - t0, 2),
        "user_cpu_seconds": round(ticks[0] / CLK_TCK, 2),
        "system_cpu_seconds": round(ticks[1] / CLK_TCK, 2),
        "exit_status": proc.returncode,
        "measured_with": "proc-VmHWM-poll",
    }
    if timed:
        try:
            res.update(_time_v(time_file), measured_with="/usr/bin/time-v")
        except OSError:
            pass
        with open(time_file) as t, open(stderr_path, "a") as err:
            err.write(t.read())
    return res


# --- one large transaction (the bigtx phase) ------------------------------------------------

SLOT_STATS = ("spill_txns", "spill_count", "spill_bytes", "stream_txns", "stream_count", "stream_bytes",
              "total_txns", "total_bytes")


def slot_stats(url, slot):
    """The slot's row of pg_stat_replication_slots (PostgreSQL 14+): what the
    walsender spilled to the server's disk, streamed in progress, decoded."""
    row = psql(url, f"SELECT {', '.join(SLOT_STATS)} FROM pg_stat_replication_slots WHERE slot_name = '{slot}'")
    if not row:
        raise Failed(f"pg_stat_replication_slots has no row for {slot}")
    return dict(zip(SLOT_STATS, (int(x) for x in row.split("|"))))


def server_setting(url, name):
    """A server setting as shown (e.g. 64MB) and where its value comes from."""
    value, source = psql(url, f"SELECT current_setting('{name}'), source FROM pg_settings WHERE name = '{name}'").split("|")
    return {"value": value, "source": source}


def memory_kib(pid):
    """VmRSS and its parts (anonymous, file-backed), in KiB; zeros when gone."""
    out = {}
    for key in ("VmRSS", "RssAnon", "RssFile"):
        v = _status_field(pid, key)
        out[key] = int(v[0]) if v else 0
    return out


def _written_transaction(path):
    """The writer's lines: pg_current_wal_insert_lsn() | clock_timestamp() as
    epoch before BEGIN, the transaction's id, the same pair once its COMMIT
    returned."""
    with open(path) as f:
        lines = [l for l in f.read().split("\n") if l]
    pairs = [l.split("|") for l in lines if "|" in l]
    xids = [l for l in lines if "|" not in l]
    if len(pairs) != 2 or len(xids) != 1:
        raise Failed(f"{path}: expected 'lsn|epoch', the xid, 'lsn|epoch'; got {lines}")
    (start_lsn, started), (end_lsn, committed) = pairs
    return {"start_lsn": start_lsn, "started": float(started), "insert_lsn_after_commit": end_lsn,
            "committed": float(committed), "xid": int(xids[0])}


def commit_end_lsn(url, xid, start_lsn, insert_lsn):
    """The end of transaction XID's commit record, found with pg_walinspect in
    the last 64 KiB before INSERT_LSN (the insert position read right after
    the COMMIT; other sessions' WAL may follow the commit record), and where
    the figure came from. Without the extension: INSERT_LSN itself."""
    try:
        end = psql(url, f"""SELECT end_lsn FROM pg_get_wal_records_info(
                                greatest('{start_lsn}'::pg_lsn, '{insert_lsn}'::pg_lsn - 65536), '{insert_lsn}')
                             WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'
                               AND xid = '{xid % (1 << 32)}'::xid""")
    except Failed as e:
        return insert_lsn, f"pg_current_wal_insert_lsn() after COMMIT (pg_walinspect: {e})"
    if not end:
        return insert_lsn, "pg_current_wal_insert_lsn() after COMMIT (pg_walinspect found no commit record)"
    return end, "pg_walinspect: the end of the transaction's commit record"


def watch_bigtx(pid, metrics_url, slot, db_url, commit_path, first_path, rows, timeout, label,
                log_path=None, kpid=0, sample_s=0.5):
    """The connector while one transaction of ROWS outbox rows is written and
    after it commits, until its acked LSN reaches the transaction's end.

    Before the write: resets the slot's statistics, takes the CPU baselines,
    then prints `bench: watching` (the script writes the transaction only
    then). The writer leaves COMMIT_PATH (see _written_transaction) once its
    COMMIT has returned; the drain ends when the acked LSN reaches the end of
    the commit record (commit_end_lsn); the consumer leaves FIRST_PATH with the first record
    it read. Every figure is measured from the COMMIT returning (the server's
    clock_timestamp() right after, in the same session)."""
    psql(db_url, f"SELECT pg_stat_reset_replication_slot('{slot}')")
    stats0 = slot_stats(db_url, slot)
    wpid = slot_pid(db_url, slot)
    if not wpid:
        raise Failed(f"no walsender serves {slot}: the connector is not streaming")
    c0, w0, k0 = cpu_s(pid), cpu_s(wpid), cpu_s(kpid)
    text = scrape(metrics_url)
    if text is None:
        raise Failed(f"{metrics_url} did not answer")
    published0 = samples(text).get("outbox_cdc_events_published_total", 0)
    print("bench: watching", flush=True)

    deadline = time.monotonic() + timeout
    peaks = {"outbox_cdc_spill_bytes": 0, "outbox_cdc_spill_memory_bytes": 0,
             "outbox_cdc_spill_largest_transaction_bytes": 0, "outbox_cdc_spill_transactions": 0,
             "outbox_cdc_in_flight_events": 0}
    peak_rss_anon = 0
    timeline = []
    t0 = time.time()
    next_sample = t0
    tx = None
    pub_t = ack_t = None
    m = {}
    while ack_t is None:
        if not alive(pid):
            raise Failed(f"the connector exited: {log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise Failed(f"the connector did not acknowledge the transaction within {timeout}s"
                         + (f" (end {tx['end_lsn']})" if tx else " (the transaction did not commit)"))
        text = scrape(metrics_url)
        now = time.time()
        if text is not None:
            m = samples(text)
            for k in peaks:
                peaks[k] = max(peaks[k], int(m.get(k, 0)))
        mem = memory_kib(pid)
        peak_rss_anon = max(peak_rss_anon, mem["RssAnon"])
        if tx is None and os.path.exists(commit_path):
            tx = _written_transaction(commit_path)
            tx["end_lsn"], tx["end_lsn_source"] = commit_end_lsn(db_url, tx["xid"], tx["start_lsn"],
                                                                 tx["insert_lsn_after_commit"])
        if now >= next_sample:
            next_sample += sample_s
            timeline.append([round(now - t0, 2), round(mem["VmRSS"] / 1024, 1), round(mem["RssAnon"] / 1024, 1),
                             round(mem["RssFile"] / 1024, 1),
                             round(m.get("outbox_cdc_spill_bytes", 0) / 1048576, 1),
                             round(m.get("outbox_cdc_spill_memory_bytes", 0) / 1048576, 1),
                             int(m.get("outbox_cdc_events_published_total", 0) - published0),
                             cpu_s(pid)])
        if tx is not None and text is not None:
            if pub_t is None and m.get("outbox_cdc_events_published_total", 0) - published0 >= rows:
                pub_t = now
            if m.get("outbox_cdc_acked_lsn", 0) >= parse_lsn(tx["end_lsn"]):
                ack_t = now
        time.sleep(0.05)
    hwm = peak_rss_kib(pid)
    cpu, wcpu, kcpu = round(cpu_s(pid) - c0, 2), round(cpu_s(wpid) - w0, 2), round(cpu_s(kpid) - k0, 2)
    published = int(m.get("outbox_cdc_events_published_total", 0) - published0)
    if published < rows:
        raise Failed(f"the connector acknowledged {tx['end_lsn']} having published {published} of {rows} events")

    first = None
    wait_until = time.monotonic() + 60
    while first is None:
        try:
            first = load_json(first_path)
        except (OSError, ValueError):
            if time.monotonic() > wait_until:
                raise Failed(f"the consumer read no record within 60 s of the drain ({first_path})")
            time.sleep(0.1)
    stats = slot_stats(db_url, slot)
    for _ in range(50):  # reported at the end of the transaction's decoding; normally there already
        if stats["total_txns"] > stats0["total_txns"]:
            break
        time.sleep(0.1)
        stats = slot_stats(db_url, slot)
    delta = {k: stats[k] - stats0[k] for k in SLOT_STATS}

    committed = tx["committed"]
    res = {
        "rows": rows,
        "transaction_wal_bytes": parse_lsn(tx["end_lsn"]) - parse_lsn(tx["start_lsn"]),
        "write_seconds": elapsed(tx["started"], committed),
        "first_record_seconds": elapsed(committed, first["received"]),
        "first_record_commit_ts_lag_seconds": elapsed(first["timestamp_ms"] / 1000.0, first["received"]),
        "all_published_seconds": elapsed(committed, pub_t),
        "drain_seconds": elapsed(committed, ack_t),
        "connector_peak_rss_mib": round(hwm / 1024, 1),
        "connector_peak_rss_kib": hwm,
        "connector_peak_rss_anon_mib_polled": round(peak_rss_anon / 1024, 1),
        "connector_cpu_s": cpu,
        "connector_walsender_cpu_s": wcpu,
        "kafka_broker_cpu_s": kcpu,
        "connector_published_events": published,
        "connector_max_spill_bytes": peaks["outbox_cdc_spill_bytes"],
        "connector_max_spill_memory_bytes": peaks["outbox_cdc_spill_memory_bytes"],
        "connector_max_spill_largest_transaction_bytes": peaks["outbox_cdc_spill_largest_transaction_bytes"],
        "connector_max_spill_transactions": peaks["outbox_cdc_spill_transactions"],
        "connector_max_in_flight_events": peaks["outbox_cdc_in_flight_events"],
        "slot_stats_delta": delta,
        "start_lsn": tx["start_lsn"],
        "end_lsn": tx["end_lsn"],
        "end_lsn_source": tx["end_lsn_source"],
        "insert_lsn_after_commit": tx["insert_lsn_after_commit"],
        "xid": tx["xid"],
        "first_record": first,
        "timeline_columns": ["s", "rss_mib", "rss_anon_mib", "rss_file_mib", "spill_mib", "spill_memory_mib",
                             "published", "connector_cpu_s"],
        "timeline": timeline,
    }
    log(f"{label}: written in {res['write_seconds']}s ({res['transaction_wal_bytes']} B of WAL); from COMMIT: "
        f"first record {res['first_record_seconds']}s, all published {res['all_published_seconds']}s, "
        f"acked {res['drain_seconds']}s; peak RSS {res['connector_peak_rss_mib']} MiB, CPU s {cpu} "
        f"(walsender {wcpu}); server spill {delta['spill_bytes']} B in {delta['spill_txns']} tx, "
        f"streamed {delta['stream_bytes']} B in {delta['stream_txns']} tx; connector spill max "
        f"{res['connector_max_spill_bytes']} B")
    return res
