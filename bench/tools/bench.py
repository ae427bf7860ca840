#!/usr/bin/env python3
"""Helpers of bench/run.sh: Kafka topics, the latency consumer, the report.

Subcommands:
  topics-create BOOTSTRAP PARTITIONS TOPIC...   create topics (replication 1)
  topics-delete BOOTSTRAP TOPIC...              delete topics
  consume BOOTSTRAP TOPIC OUT STOP_FILE MAX_S   read TOPIC from its beginning
        (read_committed); per record write "<commit_ms> <consume_ms>" to OUT; stop when STOP_FILE
        exists and nothing arrived for 2 s, or after MAX_S seconds
  histogram METRICS_FILE                        quantiles of the connector's
        commit-to-ack histogram (Prometheus text) as JSON
  end-offsets BOOTSTRAP TOPIC                   records in TOPIC (sum of the
        partitions' end offsets), or -1 while it cannot be asked
  report RUN_DIR JSON_OUT PNG_OUT               combine a run's fragments
"""

import glob
import json
import math
import os
import sys
import time


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


def end_offsets(bootstrap, topic):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-end-offsets", "enable.auto.commit": False})
    try:
        meta = c.list_topics(topic, timeout=5)
        parts = meta.topics[topic].partitions
        total = 0
        for p in parts:
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            total += high
        print(total)
    except Exception:
        print(-1)
    finally:
        c.close()


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


def load_json(path):
    with open(path) as f:
        return json.load(f)


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
                f"p99.9 {s['p999_ms']} ms, max {s['max_ms']} ms, peak RSS {s['peak_rss_mib']} MiB; "
                f"connector stages p50/p99 ms: {stages}",
                flush=True,
            )
    cdfs = [(s.get("variant", "default"), l) for s, _, l, _ in steady_runs]

    with open(json_out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=False)
        f.write("\n")
    print(json.dumps({k: v for k, v in result.items() if k in ("drain", "steady", "steady_variants")}, indent=2))
    for d in sorted(runs, key=lambda d: d["tx_size"]):
        print(
            f"bench: drain tx={d['tx_size']} [{d['variant']}]: {d['connector_events_per_s']} events/s "
            f"(pg_recvlogical {d['pg_recvlogical_events_per_s']}, ratio {d['ratio']}), "
            f"CPU s {d['connector_cpu_s']} ({d['connector_cpu_us_per_event']} us/event), "
            f"peak RSS {d['peak_rss_mib']} MiB",
            flush=True,
        )
    plot(result, samples, lat_sorted, lags, cdfs, png_out)


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
        peer = {p["tx_size"]: p["events_per_s"] for p in result.get("peer", [])}
        if peer:
            series.append(("Debezium 3.6.1 → Kafka", [peer.get(t, 0) for t in tx_sizes], None))
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


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "topics-create":
        topics_create(args[0], args[1], args[2:])
    elif cmd == "topics-delete":
        topics_delete(args[0], args[1:])
    elif cmd == "consume":
        consume(*args)
    elif cmd == "end-offsets":
        end_offsets(args[0], args[1])
    elif cmd == "histogram":
        print(json.dumps(histogram_summary(args[0])))
    elif cmd == "report":
        report(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
