//! The OpenAI Responses API (`POST /v1/responses`): named `response.*` SSE events, shaped as
//! in the captured stream `testdata/fixtures/llmock-openai-responses-stream.sse`.
//!
//! Every event carries its `sequence_number`: the preamble's four events are 0..=3, token `i`
//! is `4 + i`, and the epilogue follows the last token.

use bytes::Bytes;
use tailguard_core::render::ErrorInfo;

use crate::wire::{CREATED, Ctx, J, full_text, obj, sse_event, token_text};

/// Events before the first token.
const PREAMBLE: u32 = 4;

impl Ctx {
    fn item_id(&self) -> String {
        format!("msg_{}", self.id)
    }

    /// The `response` object in the state `status`, with `text` as its output when completed.
    pub(crate) fn response_object(&self, status: &str, text: &str, n: u32) -> J {
        let completed = status == "completed" || status == "incomplete";
        let output = if completed {
            J::arr([self.message_item("completed", Some(text))])
        } else {
            J::arr([])
        };
        let usage = if completed {
            obj! {"input_tokens": self.prompt_tokens, "output_tokens": n,
            "total_tokens": self.prompt_tokens + u64::from(n)}
        } else {
            J::null()
        };
        let incomplete = if status == "incomplete" {
            obj! {"reason": "max_output_tokens"}
        } else {
            J::null()
        };
        obj! {
            "id": &self.id, "object": "response", "created_at": CREATED, "status": status,
            "model": &self.model, "output": output, "parallel_tool_calls": J("true".to_owned()),
            "tool_choice": "auto", "tools": J::arr([]), "error": J::null(),
            "incomplete_details": incomplete, "usage": usage,
        }
    }

    fn message_item(&self, status: &str, text: Option<&str>) -> J {
        let content = match text {
            Some(t) => J::arr([self.text_part(t)]),
            None => J::arr([]),
        };
        obj! {"type": "message", "id": &self.item_id(), "status": status, "role": "assistant",
        "content": content}
    }

    fn text_part(&self, text: &str) -> J {
        obj! {"type": "output_text", "text": text, "annotations": J::arr([])}
    }

    /// `event: <type>` with `data: {"type":<type>,"sequence_number":seq,...}`.
    fn responses_event(&self, kind: &str, seq: u32, body: J) -> Bytes {
        let mut v = obj! {"type": kind, "sequence_number": seq};
        // `body` is an object: append its members after `type` and `sequence_number`.
        let members = body.0.strip_prefix('{').and_then(|m| m.strip_suffix('}'));
        if let Some(members) = members.filter(|m| !m.is_empty()) {
            v.0.pop();
            v.0.push(',');
            v.0.push_str(members);
            v.0.push('}');
        }
        sse_event(kind, &v)
    }

    fn part_fields(&self) -> J {
        obj! {"item_id": &self.item_id(), "output_index": 0u32, "content_index": 0u32}
    }

    pub(crate) fn responses_preamble(&self) -> Vec<Bytes> {
        let created = self.response_object("in_progress", "", 0);
        vec![
            self.responses_event("response.created", 0, obj! {"response": created.clone()}),
            self.responses_event("response.in_progress", 1, obj! {"response": created}),
            self.responses_event(
                "response.output_item.added",
                2,
                obj! {"output_index": 0u32, "item": self.message_item("in_progress", None)},
            ),
            self.responses_event(
                "response.content_part.added",
                3,
                self.part_fields().with("part", self.text_part("")),
            ),
        ]
    }

    pub(crate) fn responses_token(&self, i: u32) -> Bytes {
        self.responses_event(
            "response.output_text.delta",
            PREAMBLE + i,
            self.part_fields().with("delta", token_text(i)),
        )
    }

    pub(crate) fn responses_epilogue(&self, n: u32) -> Vec<Bytes> {
        let text = full_text(n);
        let seq = PREAMBLE + n;
        let status = if self.truncated {
            "incomplete"
        } else {
            "completed"
        };
        vec![
            self.responses_event(
                "response.output_text.done",
                seq,
                self.part_fields().with("text", &text),
            ),
            self.responses_event(
                "response.content_part.done",
                seq + 1,
                self.part_fields().with("part", self.text_part(&text)),
            ),
            self.responses_event(
                "response.output_item.done",
                seq + 2,
                obj! {"output_index": 0u32,
                "item": self.message_item("completed", Some(&text))},
            ),
            self.responses_event(
                &format!("response.{status}"),
                seq + 3,
                obj! {"response": self.response_object(status, &text, n)},
            ),
        ]
    }

    /// The Responses API's in-band `error` event.
    pub(crate) fn responses_error(&self, info: &ErrorInfo) -> Bytes {
        let v = obj! {"type": "error", "code": info.code, "message": info.message.as_ref(),
        "param": J::null(), "sequence_number": 0u32};
        sse_event("error", &v)
    }
}

#[cfg(test)]
mod tests {
    use tailguard_core::{Dialect, StreamTracker};

    use super::*;
    use crate::wire::Api;

    fn ctx(truncated: bool) -> Ctx {
        Ctx {
            api: Api::Responses,
            id: "resp-mock-0".to_owned(),
            model: "m".to_owned(),
            include_usage: false,
            tool_calls: false,
            prompt_tokens: 2,
            truncated,
            offset: 0,
        }
    }

    fn stream(c: &Ctx, n: u32) -> Vec<Bytes> {
        let mut out = c.preamble();
        out.extend((0..n).map(|i| c.token(i)));
        out.extend(c.epilogue(n));
        out
    }

    #[test]
    fn the_stream_has_named_events_in_sequence_and_core_reads_it() {
        let c = ctx(false);
        let events = stream(&c, 3);
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "text/event-stream".parse().unwrap());
        let mut tracker = StreamTracker::new(&Dialect::Auto, &headers);
        let mut tokens = 0;
        let mut done = false;
        for (seq, e) in events.iter().enumerate() {
            let text = std::str::from_utf8(e).unwrap();
            let name = text
                .lines()
                .next()
                .unwrap()
                .strip_prefix("event: ")
                .unwrap();
            let data = text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], name);
            assert_eq!(v["sequence_number"], seq as u64);
            let o = tracker.observe(e);
            tokens += o.tokens;
            done |= o.done;
        }
        assert_eq!(tokens, 3);
        assert!(done);
        let last = std::str::from_utf8(events.last().unwrap()).unwrap();
        assert!(last.starts_with("event: response.completed\n"));
        assert!(last.contains(r#""output_tokens":3"#));
        assert!(last.contains(r#""text":"Hello there,""#));
    }

    #[test]
    fn a_truncated_stream_is_incomplete_and_errors_are_error_events() {
        let c = ctx(true);
        let last = c.epilogue(2).pop().unwrap();
        assert!(last.starts_with(b"event: response.incomplete\n"));
        let err = c.error_event().unwrap();
        assert!(
            err.starts_with(b"event: error\ndata: {\"type\":\"error\",\"code\":\"mock_error\"")
        );
        let body = c.non_streamed(2);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["object"], "response");
        assert_eq!(v["output"][0]["content"][0]["text"], "Hello there");
    }
}
