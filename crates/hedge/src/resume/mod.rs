//! Mid-stream resume (issue 33): when a stream breaks after its first token, a continuation
//! request to another replica goes on from what the client already got, and its stream is
//! spliced onto the client's, which sees one stream with a pause, never a repeat.
//!
//! `plan` decides at request time whether a request can be resumed and builds continuation
//! bodies; `read` reads a stream event by event (holding back incomplete events and early
//! terminal events) and splices continuations; `finish` ends a stream that broke once its
//! output limit was used up. All three are pure: the tower layer drives them.

// `plan` and `read` as above; `layer` (the layer, its service and response future) and
// `body` (the client's body, which drives the reader and sends continuations).
mod body;
mod finish;
mod layer;
mod plan;
mod read;
mod stall;

pub use body::ResumeBody;
pub use layer::{ResponseFuture as ResumeFuture, Resume, ResumeLayer};
pub use plan::NotResumable;
