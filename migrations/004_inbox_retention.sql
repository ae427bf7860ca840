-- Inbox retention: an index on processed_at, so that deleting the rows older
-- than the retention does not scan the whole inbox.
--
-- The retention (docs/guarantees.md, "What consumers must do"): an inbox row
-- must outlive every way its event can be published again: the slot backlog
-- plus Kafka retention, and, since `replay` and `audit --repair` republish
-- any retained outbox row into the live topics, the outbox's own retention
-- ([prune] retention; without pruning, all of it). Then, for example:
--
--   DELETE FROM public.processed_events
--    WHERE processed_at < now() - interval '30 days';
--
-- Idempotent: safe to apply again on every deploy.

CREATE INDEX IF NOT EXISTS processed_events_processed_at
    ON public.processed_events (processed_at);
