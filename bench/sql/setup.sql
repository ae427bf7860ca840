-- Benchmark helpers, applied in the benchmark's own database after
-- migrations/*.sql. Nothing here is used by the connector itself.

-- The JSON payload of event number i: about 300 bytes as text (jsonb output),
-- shaped like an order.
CREATE OR REPLACE FUNCTION bench_payload(i bigint)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT jsonb_build_object(
        'order_id', 'order-' || i,
        'customer_id', 'customer-' || (i % 5000),
        'amount_cents', (i * 7919) % 1000000,
        'currency', 'EUR',
        'status', 'PLACED',
        'lines', jsonb_build_array(
            jsonb_build_object('sku', 'SKU-' || (i % 997), 'qty', 1 + i % 5, 'price_cents', (i * 31) % 10000),
            jsonb_build_object('sku', 'SKU-' || (i % 991), 'qty', 1 + i % 3, 'price_cents', (i * 17) % 10000)),
        'note', md5(i::text) || md5((i + 1)::text))
$$;

-- Writes the events i of 0..p_events-1 with i % p_parts = p_part (one
-- writer of p_parts running in parallel) in transactions of p_tx_size rows,
-- spread over p_aggregates aggregates (aggregate_id = 'agg-' || i %
-- p_aggregates, aggregate_sequence = i / p_aggregates + 1: unique, though with
-- several writers not always increasing in commit order). Plain inserts
-- instead of outbox_emit(): the backlog must be written fast, and the relay
-- reads the same row. Call with synchronous_commit = off in the session: the
-- backlog's durability is not what is measured.
CREATE OR REPLACE PROCEDURE bench_fill(
    p_events bigint,
    p_tx_size integer,
    p_aggregate_type text,
    p_aggregates integer,
    p_part integer DEFAULT 0,
    p_parts integer DEFAULT 1)
LANGUAGE plpgsql
AS $$
DECLARE
    next_i bigint := p_part;
BEGIN
    WHILE next_i < p_events LOOP
        INSERT INTO public.outbox_events
            (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
        SELECT gen_random_uuid(), p_aggregate_type, 'agg-' || (i % p_aggregates),
               i / p_aggregates + 1, 'OrderPlaced', bench_payload(i)
        FROM generate_series(next_i, least(next_i + (p_tx_size - 1)::bigint * p_parts, p_events - 1), p_parts) AS i;
        COMMIT;
        next_i := next_i + p_tx_size::bigint * p_parts;
    END LOOP;
END
$$;

-- The bigtx phase's one large transaction: rows 0..p_rows-1 shaped like
-- bench_fill's, inserted in the caller's transaction (BEGIN; SELECT
-- bench_insert(...); COMMIT), whose id it returns (to find its commit
-- record in the WAL).
CREATE OR REPLACE FUNCTION bench_insert(p_rows bigint, p_aggregate_type text, p_aggregates integer)
RETURNS xid8
LANGUAGE sql
AS $$
    INSERT INTO public.outbox_events
        (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
    SELECT gen_random_uuid(), p_aggregate_type, 'agg-' || (i % p_aggregates),
           i / p_aggregates + 1, 'OrderPlaced', bench_payload(i)
    FROM generate_series(0, p_rows - 1) AS i;
    SELECT pg_current_xact_id();
$$;
