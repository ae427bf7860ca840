//! Transactions the server streams while in progress (pgoutput protocol 2,
//! `[postgres] streaming`): their blocks go to the [`Spill`]; at Stream
//! Commit they are read back one message per turn of the session's loop
//! ([`Replay`]) as if the transaction had arrived whole; Stream Abort drops
//! them, or one subtransaction's part of them.

use crate::error::PipelineError;
use crate::pg::Lsn;
use crate::pgoutput::{self, Commit, Message, StreamAbort, StreamCommit, StreamStart};
use crate::pipeline::delivery::Delivery;
use crate::pipeline::spill::{Spill, SpillReader};
use tracing::debug;

use super::{Session, protocol};

/// A committed streamed transaction being read back from the spill.
pub(super) struct Replay {
    pub(super) reader: SpillReader,
    pub(super) commit: Commit,
}

impl<D: Delivery> Session<'_, D> {
    /// The spill, when streaming was asked for and no transaction is open:
    /// the only place a Stream Start, Commit or Abort may come.
    fn spill_between_transactions(&mut self) -> Option<&mut Spill> {
        self.spill.as_mut().filter(|_| self.open.is_none())
    }

    /// Stream Start: a block of one in-progress transaction follows.
    pub(super) fn stream_start(
        &mut self,
        lsn: Lsn,
        start: StreamStart,
    ) -> Result<(), PipelineError> {
        let xid = start.xid;
        let Some(spill) = self.spill_between_transactions() else {
            return Err(protocol(
                lsn,
                format!(
                    "Stream Start of transaction {xid} inside a transaction or without streaming asked for"
                ),
            ));
        };
        let known = match start.first_segment {
            true => spill.begin(xid),
            false => spill.is_open(xid),
        };
        if !known {
            return Err(protocol(
                lsn,
                match start.first_segment {
                    true => format!("a second first segment of streamed transaction {xid}"),
                    false => format!(
                        "a later segment of streamed transaction {xid} whose first segment was not received"
                    ),
                },
            ));
        }
        self.block = Some(xid);
        Ok(())
    }

    /// A message inside the streamed block of transaction `xid`: changes that
    /// may be outbox rows, and the Relations that describe them, are spilled
    /// as received; nothing else in a block is ever an event.
    pub(super) fn on_streamed(
        &mut self,
        lsn: Lsn,
        xid: u32,
        streamed: pgoutput::Streamed,
        data: &bytes::Bytes,
    ) -> Result<(), PipelineError> {
        let spill = self
            .spill
            .as_mut()
            .expect("a block is only opened with a spill");
        match (&streamed.message, streamed.xid) {
            (Message::StreamStop, _) => self.block = None,
            (Message::Relation(_) | Message::Insert(_), Some(sub)) => {
                if !spill.append(xid, sub, lsn, data)? {
                    return Err(protocol(
                        lsn,
                        format!("a change of streamed transaction {xid}, which is not open"),
                    ));
                }
            }
            // Not events: updates, deletes and truncates never are; a
            // logical message is not, since streaming is refused with a
            // message_prefix (config); Type and Origin describe nothing we map.
            (
                Message::Update(_)
                | Message::Delete(_)
                | Message::Truncate(_)
                | Message::Message(_)
                | Message::Type(_),
                Some(_),
            )
            | (Message::Origin(_), None) => {}
            (other, _) => {
                return Err(protocol(
                    lsn,
                    format!(
                        "message {:?} inside the streamed block of transaction {xid}",
                        other.tag() as char
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Stream Commit: the spilled transaction begins, to be read back.
    pub(super) fn stream_commit(
        &mut self,
        lsn: Lsn,
        StreamCommit { xid, commit }: StreamCommit,
    ) -> Result<(), PipelineError> {
        let reader = match self.spill_between_transactions() {
            Some(spill) => spill.commit(xid)?,
            None => None,
        };
        let Some(reader) = reader else {
            return Err(protocol(
                lsn,
                format!("Stream Commit of transaction {xid}, which was not being streamed"),
            ));
        };
        self.begin(lsn, commit.commit_lsn, commit.commit_time)?;
        self.replay = Some(Replay { reader, commit });
        Ok(())
    }

    /// Stream Abort: the transaction or one of its subtransactions rolled
    /// back; its spilled changes are never read.
    pub(super) fn stream_abort(
        &mut self,
        lsn: Lsn,
        abort: StreamAbort,
    ) -> Result<(), PipelineError> {
        let Some(spill) = self.spill_between_transactions() else {
            return Err(protocol(
                lsn,
                "Stream Abort inside a transaction or without streaming asked for",
            ));
        };
        let known = spill.abort(abort.xid, abort.subxid)?;
        debug!(
            xid = abort.xid,
            subxid = abort.subxid,
            known,
            "streamed transaction rolled back"
        );
        Ok(())
    }

    /// The next spilled message of the committed streamed transaction being
    /// read back, or its commit once all were read.
    pub(super) async fn replay_next(&mut self) -> Result<(), PipelineError> {
        let replay = self.replay.as_mut().expect("called while replaying");
        let next = replay.reader.next_record()?;
        let Some((lsn, data)) = next else {
            let commit = self.replay.take().expect("replaying").commit;
            return self
                .on_message(commit.commit_lsn, Message::Commit(commit))
                .await;
        };
        let streamed = pgoutput::decode_streamed(&data)
            .map_err(|source| PipelineError::Decode { lsn, source })?;
        self.on_message(lsn, streamed.message).await
    }
}
