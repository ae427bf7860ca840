-- Consumer side of the contract: the inbox that makes a duplicate delivery a
-- no-op, and the demo business tables the reference consumer writes.
--
-- A consumer inserts (consumer_name, event_id) with ON CONFLICT DO NOTHING
-- RETURNING in the same transaction as its business change, and applies the
-- change only when the insert returned a row. How long to keep rows:
-- 004_inbox_retention.sql.
--
-- Idempotent: safe to apply again on every deploy.

CREATE TABLE IF NOT EXISTS public.processed_events (
    consumer_name text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_name, event_id)
);

-- Demo: the producer side writes an order and emits OrderCreated in one transaction.
CREATE TABLE IF NOT EXISTS public.orders (
    order_id     text        PRIMARY KEY,
    customer     text,
    amount_cents bigint,
    created_at   timestamptz DEFAULT now()
);

-- Demo: the consumer's business effect, keyed by the event that caused it.
CREATE TABLE IF NOT EXISTS public.inventory_reservations (
    event_id uuid PRIMARY KEY,
    order_id text,
    sku      text,
    qty      int
);
