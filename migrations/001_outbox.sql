-- The outbox table of the seed, without the polling relay's bookkeeping columns
-- (available_at, claimed_by, claim_until, published_at, attempt_count,
-- last_error): a CDC relay reads committed inserts from the WAL, so rows are
-- never claimed, retried or marked as published. See docs/outbox-table.md.
--
-- Idempotent: safe to apply again on every deploy.

CREATE TABLE IF NOT EXISTS public.outbox_events (
    event_id           uuid        PRIMARY KEY,
    aggregate_type     text        NOT NULL,
    aggregate_id       text        NOT NULL,
    aggregate_sequence bigint      NOT NULL,
    event_type         text        NOT NULL,
    schema_version     integer     NOT NULL DEFAULT 1,
    payload            jsonb       NOT NULL,
    occurred_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_events_aggregate_sequence_key
        UNIQUE (aggregate_type, aggregate_id, aggregate_sequence)
);

-- Retention cleanup deletes by age in bounded batches (docs/outbox-table.md).
CREATE INDEX IF NOT EXISTS outbox_events_occurred_at_idx
    ON public.outbox_events (occurred_at);

-- The last sequence number handed out per aggregate. Kept apart from
-- outbox_events so numbering survives retention cleanup and the
-- insert-then-delete writer pattern (where outbox_events stays empty).
CREATE TABLE IF NOT EXISTS public.outbox_aggregate_sequences (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_sequence  bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Next sequence number of one aggregate, inside the caller's transaction.
--
-- The upsert leaves the aggregate's counter row locked until the caller's
-- transaction ends, so a concurrent writer of the same aggregate waits, then
-- (READ COMMITTED) increments the committed value. Hence: numbers are
-- consecutive (1, 2, 3, ...; a rollback returns its number), and a higher
-- number always commits later, i.e. appears later in the WAL. Under
-- REPEATABLE READ or SERIALIZABLE the waiting writer gets a serialization
-- failure (SQLSTATE 40001) instead and must retry its transaction.
CREATE OR REPLACE FUNCTION public.outbox_next_sequence(p_aggregate_type text, p_aggregate_id text)
RETURNS bigint
LANGUAGE sql
VOLATILE
AS $$
    INSERT INTO public.outbox_aggregate_sequences AS s (aggregate_type, aggregate_id, last_sequence)
    VALUES (p_aggregate_type, p_aggregate_id, 1)
    ON CONFLICT (aggregate_type, aggregate_id)
        DO UPDATE SET last_sequence = s.last_sequence + 1
    RETURNING s.last_sequence
$$;

-- Appends one event to the outbox in the caller's transaction and returns its id.
-- Call it in the same transaction as the business change it describes.
CREATE OR REPLACE FUNCTION public.outbox_emit(
    p_aggregate_type text,
    p_aggregate_id   text,
    p_event_type     text,
    p_payload        jsonb,
    p_schema_version integer DEFAULT 1
)
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_event_id uuid := gen_random_uuid();
BEGIN
    INSERT INTO public.outbox_events
        (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload)
    VALUES
        (v_event_id, p_aggregate_type, p_aggregate_id,
         public.outbox_next_sequence(p_aggregate_type, p_aggregate_id),
         p_event_type, p_schema_version, p_payload);
    RETURN v_event_id;
END
$$;
