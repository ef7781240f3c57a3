//! Small body building blocks shared by the layers.

use bytes::{Buf, Bytes};

/// A data chunk that is either the inner body's own data or bytes a layer produced itself
/// (a replayed request frame, a rendered in-band error event).
///
/// Lets a body wrapper pass `B::Data` through untouched and still emit bytes of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<D> {
    /// Data from the inner body, passed through untouched.
    Inner(D),
    /// Bytes produced by a layer.
    Local(Bytes),
}

impl<D> From<Bytes> for Chunk<D> {
    /// Local bytes, e.g. a rendered error page of a layer outside the one that made `Chunk`s.
    fn from(bytes: Bytes) -> Self {
        Chunk::Local(bytes)
    }
}

impl<D: Buf> Buf for Chunk<D> {
    fn remaining(&self) -> usize {
        match self {
            Chunk::Inner(d) => d.remaining(),
            Chunk::Local(b) => b.remaining(),
        }
    }

    fn chunk(&self) -> &[u8] {
        match self {
            Chunk::Inner(d) => d.chunk(),
            Chunk::Local(b) => b.chunk(),
        }
    }

    fn advance(&mut self, cnt: usize) {
        match self {
            Chunk::Inner(d) => d.advance(cnt),
            Chunk::Local(b) => b.advance(cnt),
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        match self {
            Chunk::Inner(d) => d.chunks_vectored(dst),
            Chunk::Local(b) => b.chunks_vectored(dst),
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        match self {
            Chunk::Inner(d) => d.copy_to_bytes(len),
            Chunk::Local(b) => b.copy_to_bytes(len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_reads_both_variants() {
        let mut a: Chunk<&[u8]> = Chunk::Inner(b"hello");
        let mut b: Chunk<&[u8]> = Chunk::Local(Bytes::from_static(b"world"));
        assert_eq!(a.remaining(), 5);
        a.advance(1);
        assert_eq!(a.chunk(), b"ello");
        assert_eq!(b.copy_to_bytes(3), Bytes::from_static(b"wor"));
        assert_eq!(b.remaining(), 2);
    }
}
