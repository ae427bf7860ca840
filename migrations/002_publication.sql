-- The publication the relay subscribes to: inserts into the outbox table only.
-- Updates, deletes and truncates are never published, which is what makes the
-- insert-then-delete writer pattern and retention cleanup invisible to the
-- relay (docs/outbox-table.md).
--
-- Idempotent: creates the publication when absent and re-asserts
-- publish = 'insert' when present. Tables an operator added are left alone.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'outbox_pub') THEN
        CREATE PUBLICATION outbox_pub FOR TABLE public.outbox_events WITH (publish = 'insert');
    ELSE
        ALTER PUBLICATION outbox_pub SET (publish = 'insert');
    END IF;

    -- The relay's role reads the table for its start-up checks; the stream
    -- itself needs only the REPLICATION attribute.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outbox') THEN
        GRANT SELECT ON public.outbox_events TO outbox;
    END IF;
END
$$;
