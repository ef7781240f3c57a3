//! The end of a stream that broke once its output limit was used up.
//!
//! When a stream breaks after the client got as many content events as the request's
//! `max_tokens` allows, there is nothing left to generate: the answer is whole, and only its
//! finish is missing (a server that interrupts for a newer request, or a connection lost, between
//! the last token and the finish chunk). A continuation cannot be sent (a limit of zero), and
//! ending as it broke would hand the client a truncated stream whose text is complete. The layer
//! ends it as the server would have: finish reason `length` (Anthropic: `max_tokens`), then the
//! dialect's terminal event.

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use super::plan::Api;
use super::read::{Sent, framed};

/// The events that end `sent`'s stream at its output limit, in `api`'s dialect, with the first
/// stream's `id`, `created` and `model` where it gave them. No usage block: the client's count of
/// output tokens is what it got.
pub(crate) fn at_limit(api: Api, sent: &Sent) -> Bytes {
    let mut out = BytesMut::new();
    let mut event =
        |name: &str, data: &str| out.extend_from_slice(&framed(name.as_bytes(), data.as_bytes()));
    match api {
        Api::Chat | Api::Completions => {
            let (object, choice) = match api {
                Api::Chat => (
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": {}, "finish_reason": "length"}),
                ),
                _ => (
                    "text_completion",
                    json!({"index": 0, "text": "", "finish_reason": "length"}),
                ),
            };
            let mut chunk = json!({"object": object, "choices": [choice]});
            for (key, value) in [
                ("id", sent.id.clone().map(Value::from)),
                ("created", sent.created.clone()),
                ("model", sent.model.clone().map(Value::from)),
            ] {
                if let Some(value) = value {
                    chunk[key] = value;
                }
            }
            event("", &chunk.to_string());
            event("", "[DONE]");
        }
        Api::Anthropic => {
            if let Some(index) = sent.anthropic_block {
                let stop = json!({"type": "content_block_stop", "index": index});
                event("content_block_stop", &stop.to_string());
            }
            let delta = json!({
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                "usage": {"output_tokens": sent.output_tokens},
            });
            event("message_delta", &delta.to_string());
            event("message_stop", r#"{"type":"message_stop"}"#);
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(out: &Bytes) -> Vec<Value> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap_or(Value::from(d)))
            .collect()
    }

    #[test]
    fn chat_ends_with_finish_length_and_done_under_the_first_streams_id() {
        let sent = Sent {
            id: Some("chatcmpl-1".into()),
            created: Some(Value::from(17)),
            model: Some("m".into()),
            output_tokens: 12,
            ..Sent::default()
        };
        let events = data(&at_limit(Api::Chat, &sent));
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["id"], "chatcmpl-1");
        assert_eq!(events[0]["created"], 17);
        assert_eq!(events[0]["model"], "m");
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["choices"][0]["finish_reason"], "length");
        assert_eq!(events[0]["choices"][0]["delta"], json!({}));
        assert_eq!(events[1], "[DONE]");
    }

    #[test]
    fn completions_end_with_an_empty_text_and_finish_length() {
        let events = data(&at_limit(Api::Completions, &Sent::default()));
        assert_eq!(events[0]["object"], "text_completion");
        assert_eq!(events[0]["choices"][0]["text"], "");
        assert_eq!(events[0]["choices"][0]["finish_reason"], "length");
        assert!(events[0].get("id").is_none(), "no id invented");
        assert_eq!(events[1], "[DONE]");
    }

    #[test]
    fn anthropic_closes_the_open_block_then_stops_at_max_tokens() {
        let sent = Sent {
            anthropic_block: Some(2),
            output_tokens: 5,
            ..Sent::default()
        };
        let out = at_limit(Api::Anthropic, &sent);
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with("event: content_block_stop\n"));
        let events = data(&out);
        assert_eq!(events[0]["index"], 2);
        assert_eq!(events[1]["delta"]["stop_reason"], "max_tokens");
        assert_eq!(events[1]["usage"]["output_tokens"], 5);
        assert_eq!(events[2]["type"], "message_stop");
        let closed = Sent::default();
        assert_eq!(data(&at_limit(Api::Anthropic, &closed)).len(), 2);
    }
}
