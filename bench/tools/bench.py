#!/usr/bin/env python3
"""The measuring side of bench/run.sh and bench/audit_rss.sh.

The scripts start and stop processes; every figure is taken here (readings
in measure.py, Kafka and the report in this file). `bench.py --help` and
`bench.py COMMAND --help` list the commands and their arguments:

  machine, config            the run's machine facts and versions, its settings
  backlog                    a written backlog: rows checked, WAL bytes, write time
  watch-recvlogical          pg_recvlogical until it exits: rate, CPU, RSS, walsender CPU
  wait-lsn                   the connector until its acked LSN (/metrics) reaches an end
                             LSN: rate, CPU (and per thread), RSS, walsender and broker CPU
  drain-run                  one drain fragment (backlog + pg_recvlogical + connector)
  watch-floor, watch-peer    the producer floor and the Debezium peer
  peer-config                Debezium's connector properties
  unmeasured                 the row of a peer or floor that was not measured, with why
  wait-metric                until a /metrics sample reaches a value
  watch-steady               after pgbench: until the consumer has read every event;
                             the steady fragment
  run-measured               run a command to its end: peak RSS (rusage), CPU, wall time
  audit-report               bench/results/audit_rss.json
  free-port                  a free loopback TCP port
  topics-create, topics-delete, consume   Kafka (the venv's confluent-kafka)
  watch-bigtx                the connector while one large transaction is written, then
                             from its COMMIT to its first record in Kafka and its acked LSN
  first-record               the first record on a topic (the bigtx phase's consumer)
  histogram METRICS_FILE     quantiles of the connector's commit-to-ack histogram
  report RUN_DIR JSON_OUT PNG_OUT         combine a run's fragments

A command that cannot measure what it was asked prints `bench: error: ...`
and exits 1 (watch-peer instead writes a row that says why, and exits 0).
"""

import argparse
import glob
import json
import math
import os
import sys
import time

import measure
from measure import Failed, load_json, log, write_json


def topics_create(bootstrap, partitions, topics):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=int(partitions), replication_factor=1) for t in topics],
        request_timeout=30,
    )
    for topic, fut in futures.items():
        fut.result(timeout=60)
        print(f"bench: created topic {topic} ({partitions} partitions)")


def topics_delete(bootstrap, topics):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics(list(topics), request_timeout=30)
    for topic, fut in futures.items():
        try:
            fut.result(timeout=60)
            print(f"bench: deleted topic {topic}")
        except Exception as e:  # a missing topic is fine at cleanup
            print(f"bench: deleting topic {topic}: {e}", file=sys.stderr)


def consume(bootstrap, topic, out_path, stop_file, max_seconds):
    """Record timestamps are the transaction's commit time (CreateTime set by
    the connector, Unix ms, truncated); the consume time is taken when the
    batch holding the record is returned by the client."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{os.getpid()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
            # What a consumer of an exactly-once relay must use: a record is
            # visible when its Kafka transaction commits (at-least-once
            # records are not transactional: the same either way).
            "isolation.level": "read_committed",
        }
    )
    meta = consumer.list_topics(topic, timeout=30)
    parts = meta.topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    deadline = time.monotonic() + float(max_seconds)
    last = time.monotonic()
    n = 0
    with open(out_path, "w") as out:
        # An open (not yet stopped) consumer signals readiness with this line.
        print("bench: consumer ready", flush=True)
        while time.monotonic() < deadline:
            # poll() returns as soon as one record is there (consume(n, t)
            # would wait for n records or t); then take what is buffered.
            first = consumer.poll(0.05)
            now_ms = time.time() * 1000.0
            batch = [] if first is None else [first] + consumer.consume(num_messages=2000, timeout=0)
            if batch:
                last = time.monotonic()
            lines = []
            for msg in batch:
                if msg.error():
                    continue
                _, ts = msg.timestamp()
                lines.append(f"{ts} {now_ms:.3f}\n")
            n += len(lines)
            out.writelines(lines)
            if lines:
                out.flush()  # run.sh counts the lines while the load runs
            if os.path.exists(stop_file) and time.monotonic() - last > 2.0:
                break
    consumer.close()
    print(f"bench: consumer read {n} records", flush=True)


def first_record(bootstrap, topic, out_path, max_seconds):
    """The first record on TOPIC (read from its beginning, read_committed):
    its receive time (when the client returned it), record timestamp,
    partition and offset, as JSON in OUT_PATH; then exit (reading the rest
    would take CPU from the relay being measured)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{os.getpid()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
            "fetch.min.bytes": 1,
            "isolation.level": "read_committed",
        }
    )
    meta = consumer.list_topics(topic, timeout=30)
    parts = meta.topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    deadline = time.monotonic() + float(max_seconds)
    print("bench: consumer ready", flush=True)
    msg = None
    while time.monotonic() < deadline:
        msg = consumer.poll(0.05)
        if msg is not None and not msg.error():
            break
        msg = None
    received = time.time()
    consumer.close()
    if msg is None:
        print(f"bench: no record on {topic} within {max_seconds} s", flush=True)
        return 1
    _, ts = msg.timestamp()
    with open(out_path + ".tmp", "w") as f:
        json.dump({"received": round(received, 4), "timestamp_ms": ts, "partition": msg.partition(),
                   "offset": msg.offset()}, f)
    os.replace(out_path + ".tmp", out_path)  # the watcher reads it whole or not at all
    print(f"bench: first record: partition {msg.partition()} offset {msg.offset()}", flush=True)
    return 0


def parse_histogram(text, name="outbox_cdc_commit_to_ack_seconds", labels=""):
    """One histogram series; `labels` is its label set as exposed, e.g. 'stage="x"'."""
    buckets = []
    count = 0.0
    total = 0.0
    bucket_prefix = name + "_bucket{" + (labels + "," if labels else "") + 'le="'
    suffix = "{" + labels + "} " if labels else " "
    for line in text.splitlines():
        if line.startswith(bucket_prefix):
            le = line[len(bucket_prefix):].split('"', 1)[0]
            value = float(line.rsplit(" ", 1)[1])
            buckets.append((math.inf if le == "+Inf" else float(le), value))
        elif line.startswith(name + "_count" + suffix):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum" + suffix):
            total = float(line.rsplit(" ", 1)[1])
    buckets.sort()
    return buckets, count, total


def histogram_quantile(q, buckets, count):
    """Prometheus histogram_quantile: linear interpolation inside the bucket."""
    if count <= 0 or not buckets:
        return None
    rank = q * count
    prev_bound, prev_count = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if math.isinf(bound):
                return prev_bound  # above the last finite bound: report it
            if cum == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (cum - prev_count)
        prev_bound, prev_count = bound, cum
    return prev_bound


STAGES = ("commit_to_send", "send_to_receive", "receive_to_produce", "produce_to_ack", "ack_to_tracker")


def stage_summary(path):
    """The connector's outbox_cdc_stage_seconds, per stage: where commit-to-ack goes."""
    with open(path) as f:
        text = f.read()
    return {
        stage: histogram_summary(path, text=text, name="outbox_cdc_stage_seconds", labels=f'stage="{stage}"')
        for stage in STAGES
    }


def histogram_summary(path, text=None, name="outbox_cdc_commit_to_ack_seconds", labels=""):
    if text is None:
        with open(path) as f:
            text = f.read()
    buckets, count, total = parse_histogram(text, name, labels)
    res = {"count": int(count), "mean_ms": round(1000 * total / count, 3) if count else None}
    for label, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        v = histogram_quantile(q, buckets, count)
        res[label] = None if v is None else round(v * 1000, 3)
    # The bucket holding the slowest observation bounds the maximum.
    below = [b for b, c in buckets if c >= count and not math.isinf(b)]
    res["max_bucket_le_ms"] = round(below[0] * 1000, 3) if below else None
    return res


def quantile(sorted_values, q):
    if not sorted_values:
        return None
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


def report(run_dir, json_out, png_out):
    machine = load_json(os.path.join(run_dir, "machine.json"))
    config = load_json(os.path.join(run_dir, "config.json"))
    runs = [load_json(p) for p in sorted(glob.glob(os.path.join(run_dir, "drain_tx*_v*.json")))]
    for d in runs:
        d["ratio"] = round(d["connector_events_per_s"] / d["pg_recvlogical_events_per_s"], 3)
        d["connector_cpu_us_per_event"] = round(1e6 * d["connector_cpu_s"] / d["events"], 1)
    first_variant = runs[0]["variant"] if runs else None
    drains = sorted((d for d in runs if d["variant"] == first_variant), key=lambda d: d["tx_size"])
    result = {"machine": machine, "config": config}
    peers = [load_json(p) for p in sorted(glob.glob(os.path.join(run_dir, "peer_tx*.json")))]
    if peers:
        result["peer"] = peers
    floors = [load_json(p) for p in sorted(glob.glob(os.path.join(run_dir, "floor_tx*.json")))]
    for f in floors:
        if f.get("measured", True):
            f["cpu_us_per_event"] = round(1e6 * f["cpu_s"] / f["events"], 1)
    if floors:
        result["producer_floor"] = floors

    if drains:
        # Headline: the run with the lower ratio (the harder case for the relay).
        head = min(drains, key=lambda d: d["ratio"])
        result["drain"] = {
            "events": head["events"],
            "tx_size": head["tx_size"],
            "pg_recvlogical_events_per_s": head["pg_recvlogical_events_per_s"],
            "connector_events_per_s": head["connector_events_per_s"],
            "ratio": head["ratio"],
            "peak_rss_mib": max(d["peak_rss_mib"] for d in drains),
            "headline": "the transaction size with the lower ratio; peak_rss_mib is the max over all runs",
            "runs": drains,
        }
        others = [d for d in runs if d["variant"] != first_variant]
        if others:
            result["drain"]["variants"] = others

    # One steady phase per variant (steady_v<k>.json ...); older run
    # directories hold one, without the suffix.
    steady_runs = []
    for path in sorted(glob.glob(os.path.join(run_dir, "steady_v*.json")),
                       key=lambda p: int(p.rsplit("_v", 1)[1].split(".")[0])):
        steady_runs.append(load_steady(run_dir, path, path.rsplit("_v", 1)[1].split(".")[0]))
    if not steady_runs and os.path.exists(os.path.join(run_dir, "steady.json")):
        steady_runs.append(load_steady(run_dir, os.path.join(run_dir, "steady.json"), None))
    samples, lat_sorted, lags = [], [], []
    if steady_runs:
        steady, samples, lat_sorted, lags = steady_runs[0]
        result["steady"] = steady
        result["steady_variants"] = [
            dict({"name": s.get("variant", "default")}, **{k: v for k, v in s.items() if k != "variant"})
            for s, _, _, _ in steady_runs
        ]
        for s, _, _, _ in steady_runs:
            stages = ", ".join(f"{name} {v['p50_ms']}/{v['p99_ms']}" for name, v in s["connector_stages"].items())
            print(
                f"bench: steady [{s.get('variant', 'default')}]: {s.get('tps')} tps, {s['events']} events, "
                f"commit-to-visible (read_committed) p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, "
                f"p99.9 {s['p999_ms']} ms, max {s['max_ms']} ms, peak RSS {s['peak_rss_mib']} MiB, "
                f"connector CPU {s.get('connector_cpu_us_per_event')} us/event; "
                f"connector stages p50/p99 ms: {stages}",
                flush=True,
            )
    cdfs = [(s.get("variant", "default"), l) for s, _, l, _ in steady_runs]
    bigtx_runs = [load_json(p) for p in sorted(glob.glob(os.path.join(run_dir, "bigtx_r*_v*.json")))]
    if bigtx_runs:
        result["bigtx"] = bigtx_summary(bigtx_runs)

    with open(json_out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=False)
        f.write("\n")
    headline = {k: v for k, v in result.items() if k in ("drain", "steady", "steady_variants")}
    if headline:
        print(json.dumps(headline, indent=2))
    if "bigtx" in result:
        print(bigtx_table(result["bigtx"], result["machine"]), flush=True)
    for d in sorted(runs, key=lambda d: d["tx_size"]):
        print(
            f"bench: drain tx={d['tx_size']} [{d['variant']}]: {d['connector_events_per_s']} events/s "
            f"(pg_recvlogical {d['pg_recvlogical_events_per_s']}, ratio {d['ratio']}), "
            f"CPU s {d['connector_cpu_s']} ({d['connector_cpu_us_per_event']} us/event), "
            f"peak RSS {d['peak_rss_mib']} MiB"
            + (f"; live witness: {d['witness_checked_rows']} rows checked ({d['witness_missing_rows']} missing) "
               f"after {d['witness_checked_seconds']} s, CPU s then {d['connector_cpu_s_checked']}"
               if "witness_checked_rows" in d else "")
            + (f"; held until {d['held_seconds']} s, CPU s then {d['connector_cpu_s_held']}"
               if "connector_cpu_s_held" in d else ""),
            flush=True,
        )
    for p in result.get("peer", []) + [dict(f, name="producer floor") for f in result.get("producer_floor", [])]:
        if p.get("measured", True):
            print(f"bench: drain tx={p['tx_size']} [{p['name']}]: {p['events_per_s']} events/s, "
                  f"CPU s {p['cpu_s']}, peak RSS {p['peak_rss_mib']} MiB", flush=True)
        else:
            print(f"bench: drain tx={p['tx_size']} [{p['name']}]: not measured: {p['reason']}", flush=True)
    if "drain" in result or "steady" in result:
        plot(result, samples, lat_sorted, lags, cdfs, png_out)
    else:
        print("bench: no drain or steady phase ran: no plot", flush=True)


BIGTX_TARGET_RSS_MIB = 64
BIGTX_MEDIANS = ("write_seconds", "transaction_wal_bytes", "first_record_seconds", "all_published_seconds",
                 "drain_seconds", "connector_peak_rss_mib", "connector_cpu_s", "connector_walsender_cpu_s",
                 "kafka_broker_cpu_s", "connector_max_spill_bytes", "connector_max_spill_memory_bytes")


def bigtx_summary(runs):
    """The bigtx phase: per streaming setting, the medians over its runs and
    the issue's targets (peak RSS <= 64 MiB; with streaming, nothing spilled
    on the server), met when every run meets them."""
    import statistics

    first = runs[0]
    variants = []
    for mode in dict.fromkeys(r["streaming"] for r in runs):
        rs = [r for r in runs if r["streaming"] == mode]
        med = {k: statistics.median(r[k] for r in rs) for k in BIGTX_MEDIANS}
        for k in first["slot_stats_delta"]:
            med["server_" + k] = statistics.median(r["slot_stats_delta"][k] for r in rs)
        worst_rss = max(r["connector_peak_rss_mib"] for r in rs)
        targets = {"connector_peak_rss": {"target": f"<= {BIGTX_TARGET_RSS_MIB} MiB", "worst_mib": worst_rss,
                                          "met": worst_rss <= BIGTX_TARGET_RSS_MIB}}
        if mode == "on":
            worst_spill = max(r["slot_stats_delta"]["spill_bytes"] for r in rs)
            targets["server_spill_bytes"] = {"target": "0 with streaming", "worst": worst_spill,
                                             "met": worst_spill == 0}
        variants.append({"streaming": mode, "protocol": rs[0]["protocol"], "runs": len(rs),
                         "median": med, "targets": targets})
    return {
        "rows": first["rows"],
        "transaction": "one transaction of `rows` outbox rows (~300-byte JSON payloads) written by "
                       "BEGIN; SELECT bench_insert(rows, ...); COMMIT in one session (synchronous_commit on) while the "
                       "connector streams from a slot created before it; a fresh transaction per run",
        "logical_decoding_work_mem": first["logical_decoding_work_mem"],
        "max_spill_memory_bytes": first["max_spill_memory_bytes"],
        "order": "runs alternate between the settings in the order listed; each run has its own slot, "
                 "topic and connector process",
        "measured_from": "the COMMIT returning: the server's clock_timestamp() right after it in the writer's "
                         "session; first record = the consumer's receive time of the transaction's first "
                         "record (read_committed, started before the write); drain = the connector's "
                         "outbox_cdc_acked_lsn reaching the end of the transaction's commit record (end_lsn, found with "
                         "pg_walinspect; see each run's end_lsn_source)",
        "targets": {"connector_peak_rss_mib": BIGTX_TARGET_RSS_MIB, "server_spill_bytes_with_streaming": 0},
        "variants": variants,
        "runs": runs,
    }


def _mib(b):
    return f"{b / 1048576:,.1f} MiB"


def bigtx_table(bigtx, machine):
    """The side-by-side table (Markdown), medians first, then every run."""
    wm = bigtx["logical_decoding_work_mem"]
    lines = [
        f"bench: bigtx: {bigtx['rows']:,} rows in one transaction, logical_decoding_work_mem = {wm['value']} "
        f"({wm['source']}), connector spill memory budget {_mib(bigtx['max_spill_memory_bytes']['bytes'])} "
        f"({bigtx['max_spill_memory_bytes']['source']}); {machine.get('date_utc')}, commit "
        f"{machine.get('git_commit')}{' (dirty)' if machine.get('git_dirty') else ''}, "
        f"PostgreSQL {machine.get('postgresql')}, Kafka {machine.get('kafka')}",
        "",
        "| streaming | run | write | COMMIT → first record | COMMIT → all published | COMMIT → acked (drain) "
        "| connector peak RSS | connector CPU s | its walsender CPU s | server spill_bytes (txns) "
        "| server stream_bytes (txns) | connector largest spill_bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def row(name, run, r, s):
        return (f"| {name} | {run} | {r['write_seconds']:.3f} s | {r['first_record_seconds']:.3f} s "
                f"| {r['all_published_seconds']:.3f} s | {r['drain_seconds']:.3f} s "
                f"| {r['connector_peak_rss_mib']:.1f} MiB | {r['connector_cpu_s']:.2f} "
                f"| {r['connector_walsender_cpu_s']:.2f} | {s['spill_bytes']:,} B ({s['spill_txns']:g}) "
                f"| {s['stream_bytes']:,} B ({s['stream_txns']:g}) | {r['connector_max_spill_bytes']:,} B |")

    for v in bigtx["variants"]:
        m = v["median"]
        name = f"{v['streaming']} (protocol {v['protocol']})"
        s = {k: m["server_" + k] for k in ("spill_bytes", "spill_txns", "stream_bytes", "stream_txns")}
        s = {k: int(x) if float(x).is_integer() else x for k, x in s.items()}
        lines.append(row(f"**{name}**", f"**median of {v['runs']}**",
                         dict(m, connector_max_spill_bytes=int(m["connector_max_spill_bytes"])), s))
        for r in bigtx["runs"]:
            if r["streaming"] == v["streaming"]:
                lines.append(row("", r["run"], r, r["slot_stats_delta"]))
    lines.append("")
    for v in bigtx["variants"]:
        for name, t in v["targets"].items():
            worst = t.get("worst_mib", t.get("worst"))
            lines.append(f"bench: bigtx [streaming {v['streaming']}]: {name} {t['target']}: "
                         f"{'met' if t['met'] else 'NOT met'} (worst run: {worst})")
    return "\n".join(lines)


def load_steady(run_dir, path, k):
    """One steady phase: its figures, its latency samples (sorted too) and slot lags."""
    sfx = "" if k is None else f"_v{k}"
    steady = load_json(path)
    samples = []
    lat_path = os.path.join(run_dir, f"latency{sfx}.txt")
    if os.path.exists(lat_path):
        with open(lat_path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    ts, now = float(parts[0]), float(parts[1])
                    samples.append((ts, now - ts))
    lat_sorted = sorted(s[1] for s in samples)
    metrics = os.path.join(run_dir, f"steady_metrics{sfx}.txt")
    lags = []
    lag_path = os.path.join(run_dir, f"slot_lag{sfx}.txt")
    if os.path.exists(lag_path):
        with open(lag_path) as f:
            for line in f:
                parts = line.strip().split("|")
                if len(parts) == 2 and parts[1]:
                    lags.append((float(parts[0]), int(float(parts[1]))))
    steady.update(
        {
            "consumed_records": len(lat_sorted),
            "p50_ms": round(quantile(lat_sorted, 0.50), 1) if lat_sorted else None,
            "p99_ms": round(quantile(lat_sorted, 0.99), 1) if lat_sorted else None,
            "p999_ms": round(quantile(lat_sorted, 0.999), 1) if lat_sorted else None,
            "max_ms": round(lat_sorted[-1], 1) if lat_sorted else None,
            "latency_source": "Kafka consumer (isolation.level=read_committed): consume time minus record "
            "timestamp (the commit time, truncated to ms), over every record of the run",
            "connector_histogram": histogram_summary(metrics),
            "connector_stages": stage_summary(metrics),
            "max_slot_lag_bytes": max((l for _, l in lags), default=None),
            "slot_lag_samples": len(lags),
        }
    )
    return steady, samples, lat_sorted, lags


def plot(result, samples, lat_sorted, lags, cdfs, png_out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    title = f"outbox-cdc bench ({result['machine'].get('cpu_model', '?')}, {result['machine'].get('nproc')} cores)"
    fig.suptitle(title)

    ax = axes[0][0]
    drain = result.get("drain")
    if drain:
        tx_sizes = [d["tx_size"] for d in drain["runs"]]
        by_variant = {}
        for d in drain["runs"] + drain.get("variants", []):
            by_variant.setdefault(d["variant"], {})[d["tx_size"]] = d
        # One bar per series and transaction size: pg_recvlogical, each
        # connector variant (the headline first), then the peer if any.
        series = [("pg_recvlogical → /dev/null", [d["pg_recvlogical_events_per_s"] for d in drain["runs"]], None)]
        for name, per_tx in by_variant.items():
            label = "outbox-cdc → Kafka (acks=all)" if len(by_variant) == 1 else f"outbox-cdc {name}"
            series.append((label, [per_tx.get(t, {}).get("connector_events_per_s", 0) for t in tx_sizes],
                           [per_tx.get(t, {}).get("ratio") for t in tx_sizes]))
        peers = [p for p in result.get("peer", []) if p.get("measured", True)]
        if peers:
            peer = {p["tx_size"]: p["events_per_s"] for p in peers}
            series.append((f"{peers[0]['version'].split(',')[0]} → Kafka", [peer.get(t, 0) for t in tx_sizes], None))
        width = 0.8 / len(series)
        for j, (label, values, ratios) in enumerate(series):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(tx_sizes))]
            ax.bar(xs, values, width=width, label=label)
            for xi, v, r in zip(xs, values, ratios or []):
                if r is not None:
                    ax.text(xi, v, f"{r:.2f}×", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(range(len(tx_sizes))))
        ax.set_xticklabels([f"{t} ev/tx" for t in tx_sizes])
        ax.set_ylabel("events/s")
        ax.set_title(f"Catch-up of {drain['events']:,} events")
        ax.legend(fontsize=8)
    else:
        ax.set_axis_off()

    ax = axes[0][1]
    if any(l for _, l in cdfs):
        figures = {s["name"]: s for s in result.get("steady_variants", [])}
        for name, values in cdfs:
            n = len(values)
            if n:
                s = figures.get(name, {})
                ax.plot(values, [(i + 1) / n for i in range(n)],
                        label=f"{name}: p50 {s.get('p50_ms')} ms, p99 {s.get('p99_ms')} ms")
        ax.set_xscale("log")
        ax.set_xlabel("commit → consumed by a read_committed consumer (ms)")
        ax.set_ylabel("fraction of events")
        ax.set_title("Steady state latency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    else:
        ax.set_axis_off()

    ax = axes[1][0]
    if samples:
        t0 = min(s[0] for s in samples)
        per_sec = {}
        for ts, lat in samples:
            per_sec.setdefault(int((ts - t0) / 1000), []).append(lat)
        secs = sorted(per_sec)
        ax.plot(secs, [quantile(sorted(per_sec[s]), 0.5) for s in secs], label="p50")
        ax.plot(secs, [quantile(sorted(per_sec[s]), 0.99) for s in secs], label="p99")
        ax.plot(secs, [max(per_sec[s]) for s in secs], label="max", alpha=0.5)
        ax.set_yscale("log")
        ax.set_xlabel("s since first commit")
        ax.set_ylabel("ms")
        ax.set_title(f"Latency per second of commit ({result['steady'].get('variant', 'default')})")
        ax.legend(fontsize=8)
    else:
        ax.set_axis_off()

    ax = axes[1][1]
    if lags:
        t0 = lags[0][0]
        ax.plot([t - t0 for t, _ in lags], [l / 1024 for _, l in lags])
        ax.set_xlabel("s")
        ax.set_ylabel("KiB")
        ax.set_title(f"Slot lag (current WAL - confirmed_flush_lsn), {result['steady'].get('variant', 'default')}")
    else:
        ax.set_axis_off()

    fig.tight_layout()
    fig.savefig(png_out, dpi=100)
    print(f"bench: wrote {png_out}")


# --- commands ------------------------------------------------------------------------


def peer_version(jars_dir, pom="bench/debezium/pom.xml"):
    """What the peer runs: the resolved jars' versions, else the pom's (not resolved)."""
    dbz = measure.jar_version(jars_dir, "debezium-connector-postgres")
    connect = measure.jar_version(jars_dir, "connect-runtime")
    if not dbz:
        import re

        try:
            text = open(pom).read()
            props = dict(re.findall(r"<([a-z.]+)\.version>([^<]+)<", text))
            dbz, connect = props.get("debezium") + " (bench/debezium/pom.xml)", props.get("kafka")
        except (OSError, TypeError):
            return "Debezium (unresolved)"
    return f"Debezium {dbz}, Kafka Connect {connect} standalone, Outbox Event Router"


def cmd_machine(a):
    write_json(a.out, measure.machine_facts(
        "PostgreSQL, Kafka, the connector, pgbench and the consumer share these cores",
        a.admin_url, a.kafka_classpath, a.pg_bin, a.java, a.debezium_jars))


def cmd_config(a):
    overrides = {}
    with open(a.overrides) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                overrides[k] = v
    write_json(a.out, {
        "events": a.events, "tx_sizes": [int(x) for x in a.tx_sizes.split()],
        "aggregates": a.aggregates, "partitions": a.partitions, "backlog_writers": a.writers,
        "steady_seconds": a.steady_seconds, "clients": a.clients, "threads": a.threads,
        "rate": a.rate or "max", "connector_config": "config/example.toml",
        "connector_env_overrides": overrides,
        "variants": a.variants.split(), "steady_variants": a.steady_variants,
        "peer": a.peer, "producer_floor": bool(a.floor),
        "phases": a.phases.split(), "bigtx_rows": a.bigtx_rows, "bigtx_runs": a.bigtx_runs,
    })


def spill_budget(settings):
    """The connector's [limits] max_spill_memory_bytes in a run: the variant's
    override, the environment's, or the default."""
    for kv in settings.split(","):
        if kv.startswith("OUTBOX_CDC__LIMITS__MAX_SPILL_MEMORY_BYTES="):
            return {"bytes": int(kv.split("=", 1)[1]), "source": "variant"}
    env = os.environ.get("OUTBOX_CDC__LIMITS__MAX_SPILL_MEMORY_BYTES")
    if env:
        return {"bytes": int(env), "source": "environment"}
    return {"bytes": 16 * 1024 * 1024, "source": "default"}


def cmd_watch_bigtx(a):
    row = {"run": a.run, "streaming": a.streaming, "protocol": 2 if a.streaming == "on" else 1,
           "variant": a.variant, "variant_settings": a.settings,
           "logical_decoding_work_mem": measure.server_setting(a.db_url, "logical_decoding_work_mem"),
           "max_spill_memory_bytes": spill_budget(a.settings),
           # glibc malloc tunables the connector inherited (none in a plain run).
           "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}}
    row.update(measure.watch_bigtx(a.pid, a.metrics, a.slot, a.db_url, a.commit_file, a.first_file, a.rows,
                                   a.timeout, a.label, a.log, a.kafka_pid))
    write_json(a.out, row)


def cmd_backlog(a):
    write_json(a.out, measure.backlog(a.db_url, a.start_lsn, a.end_lsn, measure.epoch(a.started),
                                      measure.epoch(a.ended), a.events, a.tx, a.label))


def cmd_watch_recvlogical(a):
    write_json(a.out, measure.watch_recvlogical(a.pid, a.slot, a.db_url, measure.epoch(a.started), a.timeout,
                                                a.time_file, a.events, a.label))


def cmd_wait_lsn(a):
    write_json(a.out, measure.wait_lsn(a.pid, a.metrics, a.end_lsn, a.events, measure.epoch(a.started),
                                       a.timeout, a.label, a.log, a.slot, a.db_url, a.kafka_pid,
                                       threads=not a.no_threads, expect_published=a.expect_published,
                                       expect_checked=a.expect_checked, hold_until=a.hold_until))


def cmd_drain_run(a):
    """One drain row, in the order latest.json has always had."""
    backlog, rl, conn = load_json(a.backlog), load_json(a.recvlogical), load_json(a.connector)
    conn.pop("peak_rss_kib", None)
    row = {"tx_size": backlog["tx_size"], "variant": a.variant, "variant_settings": a.settings}
    row.update(backlog)
    row.update(rl)
    row.update(conn)
    write_json(a.out, row)


def cmd_watch_floor(a):
    write_json(a.out, measure.watch_floor(a.pid, a.stdout, a.timeout, a.tx, a.label, a.log, a.kafka_pid))


def cmd_watch_peer(a):
    row = {"name": "debezium", "version": peer_version(a.jars), "tx_size": a.tx, "events": a.events}
    try:
        res = measure.watch_peer(a.pid, a.bootstrap, a.topic, a.events, measure.epoch(a.started), a.timeout,
                                 a.slot, a.db_url, a.label, a.log, a.connect_url)
    except Failed as e:
        log(f"warning: {a.label}: not measured: {e}")
        row.update(measured=False, reason=f"failed: {e}")
    else:
        row.update(res)
        row.update(
            pg_recvlogical_events_per_s=load_json(a.recvlogical)["pg_recvlogical_events_per_s"],
            note="from process start (JVM start-up included) until the topic holds every event; "
            "records counted by end offsets",
            measured=True,
        )
    write_json(a.out, row)


def cmd_peer_config(a):
    """Debezium's connector properties: our slot and publication, the Outbox
    Event Router routed like ours (key = aggregate_id, value = payload as text,
    id header) into one topic."""
    import urllib.parse

    u = urllib.parse.urlparse(a.db_url)
    with open(a.out, "w") as f:
        f.write(f"""name=bench-debezium
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname={u.hostname}
database.port={u.port}
database.user={urllib.parse.unquote(u.username)}
database.password={urllib.parse.unquote(u.password or '')}
database.dbname={u.path.lstrip('/')}
topic.prefix=benchdbz
plugin.name=pgoutput
slot.name={a.slot}
publication.name=outbox_pub
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=public.outbox_events
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=event_id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement={a.topic}
""")


def cmd_unmeasured(a):
    row = {"name": "debezium", "version": peer_version(a.jars)} if a.what == "peer" else {}
    row.update(tx_size=a.tx, events=a.events, measured=False, reason=a.reason)
    write_json(a.out, row)


def cmd_wait_metric(a):
    measure.wait_metric(a.pid, a.metrics, a.name, a.at_least, a.timeout, a.log, a.slot, a.db_url)


def cmd_watch_steady(a):
    res = measure.watch_steady(a.pid, a.db_url, a.latency, a.timeout, a.metrics, a.metrics_out,
                               a.pgbench_log, a.label, a.log)
    # The connector's CPU from just before pgbench began to when the consumer
    # had read every event (--cpu-before: its CPU seconds then).
    cpu = round(measure.cpu_s(a.pid) - a.cpu_before, 3) if a.cpu_before is not None else None
    write_json(a.out, {
        "variant": a.variant, "variant_settings": a.settings, "tps": res["tps"], "events": res["events"],
        "seconds": a.seconds, "clients": a.clients, "threads": a.threads,
        "rate_limit_tps": a.rate or "none", "peak_rss_mib": res["peak_rss_mib"],
        "connector_cpu_s": cpu,
        "connector_cpu_us_per_event": round(1e6 * cpu / res["events"], 1) if cpu and res["events"] else None,
    })


def cmd_cpu_seconds(a):
    print(measure.cpu_s(a.pid))


def cmd_run_measured(a):
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    write_json(a.out, measure.run_measured(cmd, a.timeout, a.stdout, a.stderr))


def cmd_audit_report(a):
    """bench/results/audit_rss.json; exit 1 when the audit is wrong, 3 above
    the target with --enforce."""
    try:
        audit = load_json(a.audit_json)
    except (OSError, ValueError):
        m = load_json(a.measure)
        raise Failed(f"audit printed no JSON (exit status {m['exit_status']}): "
                     f"{measure.log_tail(a.audit_log)}")
    m, empty = load_json(a.measure), load_json(a.empty_measure)
    backlog, conn = load_json(a.backlog), load_json(a.connector)
    rss_kib, empty_kib, rows = m["peak_rss_kib"], empty["peak_rss_kib"], audit["rows"]
    rss_mib = round(rss_kib / 1024, 1)
    machine = measure.machine_facts("PostgreSQL and Kafka run on the same cores as the audit",
                                    a.admin_url, a.kafka_classpath, a.pg_bin, a.java)
    machine.pop("loadavg_at_start")
    result = {
        "benchmark": "outbox-cdc audit peak RSS (bench/audit_rss.sh)",
        "target_mib": a.target,
        "within_target": rss_mib < a.target,
        "audit": {
            "peak_rss_kib": rss_kib,
            "peak_rss_mib": rss_mib,
            **{k: m[k] for k in ("wall_seconds", "user_cpu_seconds", "system_cpu_seconds", "exit_status",
                                 "measured_with", "peak_rss_kib_polled")},
            "since": a.since,
            **{k: audit[k] for k in ("rows", "records", "topics", "missing", "phantoms", "duplicates",
                                     "order_violations")},
        },
        "empty_window_audit": {
            "peak_rss_kib": empty_kib,
            "peak_rss_mib": round(empty_kib / 1024, 1),
            "wall_seconds": empty["wall_seconds"],
            "exit_status": empty["exit_status"],
        },
        "bytes_per_row_above_empty_window": round((rss_kib - empty_kib) * 1024 / rows, 1) if rows else None,
        "backlog": {
            "rows": a.rows,
            "aggregates": a.aggregates,
            "rows_per_transaction": a.tx_size,
            "payload": "bench_payload(i): ~300-byte JSON (bench/sql/setup.sql)",
            "write_seconds": backlog["write_seconds"],
            "wal_bytes": backlog["wal_bytes"],
            "all_acked_seconds_after_write_start": conn["connector_seconds"],
            "connector_published": conn["connector_published_events"],
            "connector_sequence_gaps": conn["connector_sequence_gaps"],
            "connector_peak_rss_mib": conn["peak_rss_mib"],
        },
        "machine": machine,
        "reproduce": f"scripts/env.sh up && BENCH_AUDIT_ROWS={a.rows} bench/audit_rss.sh",
    }
    write_json(a.out, result)
    log(f"audit: peak RSS {rss_kib} KiB ({rss_mib} MiB), wall {m['wall_seconds']}s, rows {rows}, "
        f"records {audit['records']}, missing {audit['missing']}, phantoms {audit['phantoms']}, "
        f"duplicates {audit['duplicates']}, order violations {audit['order_violations']}")
    log(f"empty window: peak RSS {empty_kib} KiB; results in {a.out}")
    if rows != a.rows:
        raise Failed(f"the audit counted {rows} rows, not {a.rows}")
    if audit["missing"]:
        raise Failed(f"the audit found {audit['missing']} missing rows")
    if m["exit_status"]:
        raise Failed(f"the audit exited with status {m['exit_status']}: {measure.log_tail(a.audit_log)}")
    if rss_mib >= a.target:
        log(f"peak RSS is above the {a.target} MiB target")
        if a.enforce:
            return 3
    return 0


def cmd_free_port(_a):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
    s.close()


def parser():
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, fn, help_text):
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.set_defaults(fn=fn)
        return c

    def add(c, *names, **kw):
        for n in names:
            c.add_argument(f"--{n}", required=kw.get("required", True), type=kw.get("type", str),
                           default=kw.get("default"))

    # Where a phase fails, its message names it; --label prefixes the log lines.
    c = command("machine", cmd_machine, "machine facts and versions, as JSON")
    c.add_argument("out")
    add(c, "admin-url", "kafka-classpath", "pg-bin", "java")
    add(c, "debezium-jars", required=False)

    c = command("config", cmd_config, "the run's settings, as JSON")
    c.add_argument("out")
    add(c, "events", "aggregates", "partitions", "writers", "steady-seconds", "clients", "threads", "floor",
        type=int)
    add(c, "tx-sizes", "variants", "steady-variants", "overrides", "peer")
    add(c, "rate", required=False, default="")
    add(c, "phases", required=False, default="drain steady")
    add(c, "bigtx-rows", "bigtx-runs", required=False, type=int, default=0)

    c = command("backlog", cmd_backlog, "check and measure a written backlog")
    add(c, "db-url", "start-lsn", "end-lsn", "started", "ended", "label", "out")
    add(c, "events", "tx", type=int)

    c = command("watch-recvlogical", cmd_watch_recvlogical, "pg_recvlogical until it exits")
    add(c, "pid", "events", type=int)
    add(c, "timeout", type=float)
    add(c, "slot", "db-url", "started", "time-file", "label", "out")

    c = command("wait-lsn", cmd_wait_lsn, "the connector until its acked LSN reaches END_LSN")
    add(c, "pid", "events", type=int)
    add(c, "timeout", type=float)
    add(c, "metrics", "end-lsn", "started", "label", "out")
    add(c, "log", "slot", "db-url", required=False)
    add(c, "kafka-pid", "expect-published", "expect-checked", required=False, type=int, default=0)
    add(c, "hold-until", required=False, type=float, default=0.0)
    c.add_argument("--no-threads", action="store_true")

    c = command("watch-bigtx", cmd_watch_bigtx,
                "the connector while one large transaction is written, until its acked LSN reaches its end")
    add(c, "pid", "rows", "run", type=int)
    add(c, "timeout", type=float)
    add(c, "metrics", "slot", "db-url", "commit-file", "first-file", "streaming", "variant", "label", "out")
    add(c, "log", required=False)
    add(c, "settings", required=False, default="")
    add(c, "kafka-pid", required=False, type=int, default=0)

    c = command("drain-run", cmd_drain_run, "one drain row from its fragments")
    add(c, "backlog", "recvlogical", "connector", "variant", "out")
    add(c, "settings", required=False, default="")

    c = command("watch-floor", cmd_watch_floor, "produce_floor until it prints its figures")
    add(c, "pid", "tx", type=int)
    add(c, "timeout", type=float)
    add(c, "stdout", "label", "out")
    add(c, "log", required=False)
    add(c, "kafka-pid", required=False, type=int, default=0)

    c = command("watch-peer", cmd_watch_peer, "Debezium until its topic holds every event")
    add(c, "pid", "tx", "events", type=int)
    add(c, "timeout", type=float)
    add(c, "bootstrap", "topic", "started", "slot", "db-url", "label", "recvlogical", "out")
    add(c, "log", "connect-url", "jars", required=False)

    c = command("peer-config", cmd_peer_config, "Debezium's connector properties")
    add(c, "db-url", "slot", "topic", "out")

    c = command("unmeasured", cmd_unmeasured, "the row of a peer or producer floor not measured")
    c.add_argument("what", choices=["peer", "floor"])
    add(c, "tx", "events", type=int)
    add(c, "reason", "out")
    add(c, "jars", required=False)

    c = command("wait-metric", cmd_wait_metric, "until a /metrics sample reaches a value")
    add(c, "pid", type=int)
    add(c, "timeout", "at-least", type=float)
    add(c, "metrics", "name")
    add(c, "log", "slot", "db-url", required=False)

    c = command("watch-steady", cmd_watch_steady, "after pgbench: until the consumer read every event")
    add(c, "pid", "seconds", "clients", "threads", type=int)
    add(c, "timeout", type=float)
    add(c, "db-url", "latency", "metrics", "metrics-out", "pgbench-log", "label", "variant", "out")
    add(c, "log", required=False)
    add(c, "settings", "rate", required=False, default="")
    add(c, "cpu-before", type=float, required=False)

    c = command("cpu-seconds", cmd_cpu_seconds, "CPU seconds a process has used so far")
    add(c, "pid", type=int)

    c = command("run-measured", cmd_run_measured, "run a command to its end; peak RSS, CPU, wall time")
    add(c, "timeout", type=float)
    add(c, "stdout", "stderr", "out")
    c.add_argument("cmd", nargs=argparse.REMAINDER)

    c = command("audit-report", cmd_audit_report, "bench/results/audit_rss.json from audit_rss.sh's fragments")
    add(c, "audit-json", "audit-log", "measure", "empty-measure", "backlog", "connector", "since", "out",
        "admin-url", "kafka-classpath", "pg-bin", "java")
    add(c, "rows", "aggregates", "tx-size", "target", type=int)
    c.add_argument("--enforce", action="store_true")

    command("free-port", cmd_free_port, "a free loopback TCP port")

    c = command("topics-create", lambda a: topics_create(a.bootstrap, a.partitions, a.topics),
                "create topics (replication 1)")
    c.add_argument("bootstrap")
    c.add_argument("partitions")
    c.add_argument("topics", nargs="+")
    c = command("topics-delete", lambda a: topics_delete(a.bootstrap, a.topics), "delete topics")
    c.add_argument("bootstrap")
    c.add_argument("topics", nargs="+")
    c = command("consume", lambda a: consume(a.bootstrap, a.topic, a.out, a.stop_file, a.max_seconds),
                "read TOPIC from its beginning (read_committed); per record write '<commit_ms> <consume_ms>' "
                "to OUT; stop when STOP_FILE exists and nothing arrived for 2 s, or after MAX_S seconds")
    for n in ("bootstrap", "topic", "out", "stop_file", "max_seconds"):
        c.add_argument(n)
    c = command("first-record", lambda a: first_record(a.bootstrap, a.topic, a.out, a.max_seconds),
                "wait for the first record on TOPIC (from its beginning, read_committed); write its receive "
                "time, timestamp, partition and offset as JSON to OUT; give up after MAX_S seconds")
    for n in ("bootstrap", "topic", "out", "max_seconds"):
        c.add_argument(n)
    c = command("histogram", lambda a: print(json.dumps(histogram_summary(a.metrics_file))),
                "quantiles of the connector's commit-to-ack histogram (Prometheus text) as JSON")
    c.add_argument("metrics_file")
    c = command("report", lambda a: report(a.run_dir, a.json_out, a.png_out), "combine a run's fragments")
    for n in ("run_dir", "json_out", "png_out"):
        c.add_argument(n)
    return p


def main(argv):
    args = parser().parse_args(argv[1:])
    try:
        return args.fn(args) or 0
    except Failed as e:
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
