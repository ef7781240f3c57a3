//! A stalled stream and its continuation, racing: the stream's next token first, and the
//! continuation is dropped; the continuation's first token first, and it takes over.

use std::task::{Context, Poll};

use bytes::Buf;
use http_body::Body;
use tailguard_core::{BoxError, ResumeOutcome};

use super::{End, Fallback, Phase, Reading};
use crate::resume::read::Break;

impl<RB> Reading<RB>
where
    RB: Body,
    RB::Data: From<bytes::Bytes>,
    RB::Error: Into<BoxError>,
{
    /// The live stream stalled (no token for its stall limit): a continuation goes out if the
    /// request may take one, and races the stalled stream, which is kept. A stall no
    /// continuation answers is the idle timeout's to end: the stream goes on.
    pub(super) fn stalled(&mut self) {
        let Phase::Live(body) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        self.phase = match self.resume(Break::Stall) {
            Ok(sending) => Phase::Resuming {
                sending,
                brk: Break::Stall,
                fallback: Fallback::Live(body),
            },
            Err(why) => {
                self.outcome(Break::Stall, ResumeOutcome::NotSent(why.as_str()), None);
                Phase::Live(body)
            }
        };
    }

    /// A stalled stream racing its continuation: reads its next frame, if any. A token from it
    /// first (the continuation, before its first token, would now repeat it): the
    /// continuation is dropped and the stream goes on. Other events pass on as they come; a
    /// break or end of it leaves the continuation to take over (what the client gets if that
    /// fails: the stream's end as it broke). Whether the phase moved on.
    pub(super) fn race(&mut self, cx: &mut Context<'_>) -> bool {
        let Phase::Resuming {
            fallback: Fallback::Live(body),
            ..
        } = &mut self.phase
        else {
            return false;
        };
        let Poll::Ready(next) = body.as_mut().poll_frame(cx) else {
            return false;
        };
        let Phase::Resuming {
            sending,
            brk,
            fallback: Fallback::Live(body),
        } = std::mem::replace(&mut self.phase, Phase::Done)
        else {
            return false;
        };
        let before = self.reader.sent().output_tokens;
        let fallback = match next {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    match self.reader.frame(&bytes) {
                        Ok((out, broke)) => {
                            self.out.push_back(out);
                            if self.reader.sent().output_tokens > before {
                                self.outcome(brk, ResumeOutcome::Recovered, None);
                                drop(sending);
                                self.phase = Phase::Live(body);
                                self.stall.tokens(self.reader.sent().output_tokens);
                                if let Some(b) = broke {
                                    self.broke(b, None);
                                }
                                return true;
                            }
                            match broke {
                                None => Fallback::Live(body),
                                Some(_) => Fallback::End(End::Clean),
                            }
                        }
                        Err(_) => Fallback::End(End::Clean),
                    }
                }
                // Trailers end the body; the continuation's stream will have its own end.
                Err(_) => Fallback::End(End::Clean),
            },
            Some(Err(e)) => Fallback::End(End::Error(e)),
            None => {
                let (held, ended) = self.reader.end();
                self.out.push_back(held);
                if ended.is_none() {
                    // It finished before the continuation answered: the answer is whole.
                    self.outcome(brk, ResumeOutcome::Recovered, None);
                    return true;
                }
                Fallback::End(End::Clean)
            }
        };
        self.phase = Phase::Resuming {
            sending,
            brk,
            fallback,
        };
        true
    }
}
