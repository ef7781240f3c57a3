//! The captured real streams of `testdata/fixtures` (see its README), compiled in so that any
//! crate's tests find them.

macro_rules! fixtures {
    ($($name:literal),* $(,)?) => {
        /// Every fixture: (file name, bytes).
        pub const FIXTURES: &[(&str, &[u8])] = &[
            $(($name, include_bytes!(concat!("../../../testdata/fixtures/", $name)))),*
        ];
    };
}

fixtures!(
    "llamacpp-chat-nostream.json",
    "llamacpp-chat-stream-usage.sse",
    "llamacpp-chat-stream.sse",
    "llamacpp-completions-stream.sse",
    "llmock-anthropic-messages-stream.sse",
    "llmock-openai-chat-stream-malformed.sse",
    "llmock-openai-chat-stream-truncated.sse",
    "llmock-openai-chat-stream-usage.sse",
    "llmock-openai-tool-call-stream.sse",
    "llmock-openai-responses-stream.sse",
);

/// The bytes of fixture `name` (a file name in `testdata/fixtures`); panics on an unknown name.
pub fn fixture(name: &str) -> &'static [u8] {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
        .unwrap_or_else(|| panic!("no fixture {name} in testdata/fixtures"))
}
