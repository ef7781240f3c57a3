//! However the winner's stream is cut into frames, the client gets the same frames.

mod common;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use tailguard_core::HedgeOutcome;
use tower::{Layer, ServiceExt};

fn stream() -> Vec<u8> {
    let mut s = String::new();
    s.push_str(": keepalive\n\n");
    s.push_str(ROLE);
    s.push_str(&token("Hel"));
    s.push_str(&token("lo"));
    s.push_str(DONE);
    s.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_split_of_the_winner_is_replayed_frame_for_frame(
        cuts in proptest::collection::btree_set(1usize..200, 0..12),
    ) {
        let all = stream();
        let mut frames = Vec::new();
        let mut at = 0;
        for c in cuts.into_iter().filter(|c| *c < all.len()) {
            frames.push(Bytes::copy_from_slice(&all[at..c]));
            at = c;
        }
        frames.push(Bytes::copy_from_slice(&all[at..]));
        let mut items = Vec::new();
        for f in &frames {
            items.push(Step::Wait(ms(7)));
            items.push(Step::Data(f.clone()));
        }
        let backup = Plan::items(items);
        let (outcome, got) = paused_runtime().block_on(async {
            let up = Upstream::new(vec![Plan::sse(ms(60_000)), backup]);
            let res = layer()
                .layer(up)
                .oneshot(chat_request())
                .await
                .unwrap();
            let outcome = common::outcome_without_costs(&res);
            (outcome, common::frames(res.into_body()).await.0)
        });
        prop_assert_eq!(outcome, Some(HedgeOutcome::new(2, 1, Some(ms(500)))));
        prop_assert_eq!(got, frames);
    }
}
