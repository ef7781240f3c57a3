//! gRPC length-prefixed message framing.

use crate::error::ScanError;
use crate::scan::{Captured, Event, Framer, Limits, Scanner, capture, last_non_space};

/// Scanner of gRPC bodies (see [`Grpc`]).
///
/// ```
/// use tailguard_core::scan::{Event, GrpcScanner};
///
/// let mut scanner = GrpcScanner::new();
/// let mut lens = Vec::new();
/// for frame in [&[0u8, 0, 0][..], &[0, 2, b'h'], &[b'i', 1, 0, 0, 0, 0]] {
///     scanner
///         .feed(frame, |event| {
///             if let Event::Grpc { data, .. } = event {
///                 lens.push(data.len)
///             }
///         })
///         .unwrap();
/// }
/// assert_eq!(lens, [2, 0]);
/// ```
pub type GrpcScanner = Scanner<Grpc>;

/// gRPC framing: each message is a 1-byte compressed flag, a 4-byte big-endian length and the
/// message bytes.
///
/// A message longer than the cap is an error as soon as its header arrives; the message itself
/// is never buffered (only its captured prefix is copied out). At the end of the body a partial
/// message is discarded (a truncated stream).
#[derive(Debug, Default)]
pub struct Grpc {
    limits: Limits,
    header: [u8; 5],
    header_len: usize,
    in_message: bool,
    compressed: bool,
    message_len: usize,
    message_read: usize,
    data: Vec<u8>,
    /// See [`Captured::last`].
    last: Option<u8>,
}

impl Framer for Grpc {
    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn limits_mut(&mut self) -> &mut Limits {
        &mut self.limits
    }

    fn feed(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        while !chunk.is_empty() {
            if !self.in_message {
                let take = (5 - self.header_len).min(chunk.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&chunk[..take]);
                self.header_len += take;
                self.limits.pending += take;
                chunk = &chunk[take..];
                if self.header_len < 5 {
                    break;
                }
                self.header_len = 0;
                self.compressed = self.header[0] != 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]);
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > self.limits.max {
                    return Err(ScanError::too_long("grpc message", self.limits.max));
                }
                self.message_len = len;
                self.message_read = 0;
                self.data.clear();
                self.last = None;
                self.in_message = true;
            } else {
                let take = (self.message_len - self.message_read).min(chunk.len());
                capture(&mut self.data, self.limits.capture, &chunk[..take]);
                self.last = last_non_space(&chunk[..take], self.last);
                self.message_read += take;
                self.limits.pending += take;
                chunk = &chunk[take..];
            }
            if self.in_message && self.message_read == self.message_len {
                self.in_message = false;
                self.limits.pending = 0;
                on_event(Event::Grpc {
                    compressed: self.compressed,
                    data: Captured {
                        bytes: &self.data,
                        len: self.message_len,
                        last: self.last,
                    },
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        v.extend_from_slice(msg);
        v
    }

    fn collect(
        s: &mut GrpcScanner,
        frames: &[&[u8]],
    ) -> Result<Vec<(bool, Vec<u8>, usize)>, ScanError> {
        let mut out = Vec::new();
        for f in frames {
            s.feed(f, |e| match e {
                Event::Grpc { compressed, data } => {
                    out.push((compressed, data.bytes.to_vec(), data.len))
                }
                other => panic!("{other:?}"),
            })?;
        }
        s.finish(|_| panic!("grpc finish emits nothing"))?;
        Ok(out)
    }

    #[test]
    fn messages_across_frames_and_empty_messages() {
        let mut bytes = frame(0, b"hello");
        bytes.extend(frame(1, b""));
        bytes.extend(frame(0, b"x"));
        let want = vec![
            (false, b"hello".to_vec(), 5),
            (true, Vec::new(), 0),
            (false, b"x".to_vec(), 1),
        ];
        assert_eq!(collect(&mut GrpcScanner::new(), &[&bytes]).unwrap(), want);
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(collect(&mut GrpcScanner::new(), &bytewise).unwrap(), want);
    }

    #[test]
    fn pending_bytes_and_truncation() {
        let bytes = frame(0, b"hello");
        let mut s = GrpcScanner::new();
        s.feed(&bytes[..3], |_| panic!()).unwrap();
        assert_eq!(s.pending_bytes(), 3);
        s.feed(&bytes[3..7], |_| panic!()).unwrap();
        assert_eq!(s.pending_bytes(), 7);
        // A body that ends here is truncated: nothing more is reported.
        assert!(s.finish(|_| panic!()).is_ok());
        let mut n = 0;
        s.feed(&bytes[7..], |_| n += 1).unwrap();
        assert_eq!((n, s.pending_bytes()), (1, 0));
    }

    #[test]
    fn capture_limits_the_copy() {
        let mut s = GrpcScanner::new();
        s.set_capture(2);
        let got = collect(&mut s, &[&frame(0, b"hello")]).unwrap();
        assert_eq!(got, vec![(false, b"he".to_vec(), 5)]);
    }

    #[test]
    fn message_over_the_cap_fails_at_its_header() {
        let mut s = GrpcScanner::new().with_max_event_bytes(4);
        // Only the header is fed: the error comes before any of the message.
        let err = s.feed(&[0, 0, 0, 0, 5], |_| panic!()).unwrap_err();
        assert_eq!((err.what(), err.limit()), ("grpc message", 4));
        assert_eq!(s.feed(&[0], |_| panic!()).unwrap_err(), err);
        // A 4 GiB length is refused the same way.
        let mut s = GrpcScanner::new();
        assert!(s.feed(&[0, 0xff, 0xff, 0xff, 0xff], |_| panic!()).is_err());
        // Exactly the cap is fine.
        let mut s = GrpcScanner::new().with_max_event_bytes(4);
        assert_eq!(collect(&mut s, &[&frame(0, b"abcd")]).unwrap().len(), 1);
    }
}
