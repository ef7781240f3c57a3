//! The bytes of the scripted stream faults, per dialect: garbage instead of a token, junk
//! lines around the first token, the start of an endless line, half an event, the terminal
//! event of an interrupted stream.

use bytes::{BufMut, Bytes, BytesMut};

use crate::script::Garbage;
use crate::wire::{Api, Ctx};

/// Filler of an endless line, sent in frames of this size.
static FILLER: [u8; 1 << 16] = [b'x'; 1 << 16];

/// The next `len` bytes (at most one frame) of an endless line.
pub(crate) fn filler(len: u64) -> Bytes {
    let n = usize::try_from(len).map_or(FILLER.len(), |n| n.min(FILLER.len()));
    Bytes::from_static(&FILLER[..n])
}

impl Ctx {
    /// A garbage event in place of token `i`.
    pub(crate) fn garbage(&self, kind: Garbage, i: u32) -> Bytes {
        let payload: Vec<u8> = match kind {
            Garbage::NotJson => format!("<<garbage {i}>> {{\"choices\":[").into_bytes(),
            Garbage::BadUtf8 => vec![0xff, 0xfe, b' ', 0xc3, 0x28],
        };
        let mut b = BytesMut::from(self.line_start().as_ref());
        if self.api == Api::Grpc {
            // A message of this length that is not protobuf.
            b.truncate(1);
            b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
            b.extend_from_slice(&payload);
            return b.freeze();
        }
        b.extend_from_slice(&payload);
        b.extend_from_slice(if self.api.is_ollama() { b"\n" } else { b"\n\n" });
        b.freeze()
    }

    /// Junk data line `k` of a stream (`None` for gRPC): `this is not json at all` and `{{{{`
    /// in turn, as [`Script::junk_before`](crate::Script::junk_before) documents.
    pub(crate) fn junk(&self, k: u32) -> Option<Bytes> {
        if self.api == Api::Grpc {
            return None;
        }
        let payload: &[u8] = if k.is_multiple_of(2) {
            b"this is not json at all"
        } else {
            b"{{{{"
        };
        let mut b = BytesMut::from(self.line_start().as_ref());
        b.extend_from_slice(payload);
        b.extend_from_slice(if self.api.is_ollama() { b"\n" } else { b"\n\n" });
        Some(b.freeze())
    }

    /// What starts a data line (gRPC: a message header announcing 4 GiB).
    pub(crate) fn line_start(&self) -> Bytes {
        Bytes::from_static(match self.api {
            Api::Chat | Api::Completions => b"data: ",
            Api::Anthropic => b"event: content_block_delta\ndata: ",
            Api::Responses => b"event: response.output_text.delta\ndata: ",
            Api::OllamaGenerate | Api::OllamaChat => b"",
            Api::Grpc => &[0, 0xff, 0xff, 0xff, 0xff],
        })
    }

    /// The first half of the event that follows token `i - 1` of `n`.
    pub(crate) fn half_event(&self, i: u32, n: u32) -> Bytes {
        let event = if i < n {
            self.token(i)
        } else {
            self.epilogue(n).into_iter().next().unwrap_or_default()
        };
        event.slice(..event.len() / 2)
    }

    /// The terminal event of a stream ended after `n` tokens (`None` for gRPC, whose end is
    /// its trailers).
    pub(crate) fn terminal(&self, n: u32) -> Option<Bytes> {
        if self.api == Api::Grpc {
            return None;
        }
        self.epilogue(n).pop()
    }
}
