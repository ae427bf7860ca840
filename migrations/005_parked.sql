-- Parked aggregates, shared by every instance that can hold the slot
-- (on_poison = "dead-letter"; outbox.parked_table, default
-- public.outbox_cdc_parked). An aggregate whose event was poison is parked
-- here before anything after that event is acknowledged, so the instance
-- that takes the slot over keeps sending its events to the dead-letter topic.
-- `outbox-cdc release` deletes its row. The relay creates the table itself
-- when its role may; apply this file where it may not.
--
-- Idempotent: safe to apply again on every deploy.

CREATE TABLE IF NOT EXISTS public.outbox_cdc_parked (
    slot_name      text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    reason         text        NOT NULL,
    lsn            pg_lsn      NOT NULL,
    commit_lsn     pg_lsn,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot_name, aggregate_type, aggregate_id)
);

DO $$
BEGIN
    -- The relay reads, parks and (through `outbox-cdc release`) releases.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outbox') THEN
        GRANT SELECT, INSERT, DELETE ON public.outbox_cdc_parked TO outbox;
    END IF;
END
$$;
