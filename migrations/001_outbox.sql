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

-- The writer's W3C trace context (optional; docs/outbox-table.md, "Trace
-- context"): the relay copies a valid traceparent (and tracestate) into the
-- record's headers of the same names. Added separately so that an existing
-- table gains them on the next deploy.
ALTER TABLE public.outbox_events
    ADD COLUMN IF NOT EXISTS traceparent text,
    ADD COLUMN IF NOT EXISTS tracestate  text;

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
-- p_traceparent / p_tracestate: the caller's current span (W3C Trace Context),
-- NULL when there is none.
--
-- The signature before the trace parameters is dropped first: beside the new
-- one it would make every call with five or fewer arguments ambiguous.
DROP FUNCTION IF EXISTS public.outbox_emit(text, text, text, jsonb, integer);
CREATE OR REPLACE FUNCTION public.outbox_emit(
    p_aggregate_type text,
    p_aggregate_id   text,
    p_event_type     text,
    p_payload        jsonb,
    p_schema_version integer DEFAULT 1,
    p_traceparent    text    DEFAULT NULL,
    p_tracestate     text    DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_event_id uuid := gen_random_uuid();
BEGIN
    INSERT INTO public.outbox_events
        (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload,
         traceparent, tracestate)
    VALUES
        (v_event_id, p_aggregate_type, p_aggregate_id,
         public.outbox_next_sequence(p_aggregate_type, p_aggregate_id),
         p_event_type, p_schema_version, p_payload,
         p_traceparent, p_tracestate);
    RETURN v_event_id;
END
$$;
