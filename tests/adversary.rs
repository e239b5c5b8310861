//! A scripted hostile peer that plays every item of SECURITY.md's "Inputs
//! and faults" against a real [`capwire::Node`].
//!
//! The attacker speaks below the node's friendly API: it runs the Noise
//! handshake by hand through the transport's I/O-free states (or forges
//! one over snow's primitives, to send keys it has no secret for), seals
//! each message itself, writes its own chunks and hand-made CBOR, and
//! reads the node's messages with a `RecordDecoder`. It speaks protocol
//! 2 (its first hello lists `core.protocol` 2.0.0, WIRE.md 4.1), or
//! protocol 1 when an attack needs a version-1 session. Each attack is a
//! small async fn in `tests/adversary/`, played against a fresh node
//! (loopback TCP, or in-memory pairs through `Node::accept_stream` when
//! it needs paused time); the harness (`tests/adversary/arena.rs`) then
//! checks, for every attack, that no handler ran but those the attack
//! meant (an `AtomicU64` per verb of the test's capability), that no
//! controller handler ever ran for a sender that was not bound, that the
//! binding, configuration, roster and contacts are as expected, that the
//! node let go of everything (sessions, handshakes, jobs, queued bytes)
//! and kept its ledger within budget, that an honest `Peer` request then
//! succeeds within 5 s, and that shutdown ends within its bound.
//!
//! | SECURITY.md item | attacks (test names) | also, or only, elsewhere |
//! |---|---|---|
//! | Length prefix over the limit or shorter than a tag; plaintext larger than one message | `length_prefix_over_the_handshake_limit`, `length_prefix_shorter_than_a_tag`, `record_announced_over_max_record`, `large_records_are_split_never_truncated`, `record_rules_broken` | transport/tests/security.rs `item01_*` |
//! | Truncated frame, slow-loris peer, silent peer | `truncated_message_then_end_of_stream`, `record_rules_broken` (split record cut by the end of the stream), `slow_loris_and_silent_peers`, `an_idle_closed_peer_that_keeps_its_stream_open` | `item02_*` |
//! | Bit flip in ciphertext or tag (and tampering with the rekey) | `bit_flips_in_ciphertext_and_tag`, `rekey_abuse` | `item03_*` (nonce not advanced, checked on the `Opener`) |
//! | Replayed, reordered, duplicated, dropped or reflected frames | `replayed_reordered_duplicated_dropped_reflected`, `replayed_and_reflected_handshakes` | `item04_*` |
//! | Nonce counter near 2^64-1 (test hook) | `nonce_exhaustion` (the node started with the transport's start_nonce_for_testing hook) | `item05_*` |
//! | Peer cuts the stream without a close record | `peer_cut_mid_request`, `truncated_message_then_end_of_stream` | `item06_*`, tests/calls.rs |
//! | Prologue or protocol-name mismatch | `prologue_or_protocol_name_mismatch` | `item07_*` |
//! | An older peer, or a hello that claims less than it shows (protocol 3, the audit log) | `a_version_2_control_plane_never_sees_core_audit`, `a_version_3_stranger_is_refused_the_audit_log`, `a_hello_showing_core_audit_under_protocol_2`, `a_trace_context_never_costs_a_call` | tests/audit.rs (tampering, crash, flood), tests/python_peer.rs (a version-2 peer from WIRE.md) |
//! | Trace contexts (WIRE.md 2.2): a malformed `traceparent`, all-zero ids, an oversize `tracestate` or one of 33 members, a `trace` item that is no map, a context on a protocol-2 session (each dropped and counted by reason, the call answered, the session kept); a node's contexts go only to protocol-3 peers | `a_malformed_traceparent_is_dropped_and_counted`, `an_all_zero_trace_id_is_dropped_and_counted`, `an_oversize_tracestate_is_dropped_and_counted`, `a_tracestate_of_33_members_is_dropped_and_counted`, `a_trace_item_that_is_no_map_is_dropped_and_counted`, `a_context_on_a_protocol_2_session_is_dropped_and_counted`, `no_trace_item_goes_to_a_peer_below_protocol_3`, `a_trace_item_goes_to_a_protocol_3_peer` | src/trace/context.rs unit tests, tests/trace.rs, tests/trace_forward.rs |
//! | Out-of-turn, repeated, short or long handshake messages | `handshake_messages_out_of_turn_repeated_short_long`, `replayed_and_reflected_handshakes`, `requests_before_a_valid_hello` (frames out of turn after it) | `item08_*` |
//! | Low-order remote ephemeral or static key, all points and encodings | `low_order_ephemeral_keys`, `low_order_static_keys` (forged handshakes, both roles, with a genuine-key control) | `item09_*`, transport/src/handshake.rs unit tests |
//! | Static key unknown to the contact policy, our own, or bit 255 flipped | `static_keys_judged_in_canonical_form` | `item10_*` |
//! | Flood of half-open handshakes or silent sockets | `handshake_floods`, `accept_rate_flood`, `slow_loris_and_silent_peers` | tests/bounds.rs, `item11_*` |
//! | Many idle sessions from throwaway keys | `throwaway_keys_fill_the_session_budget` | tests/bounds.rs |
//! | A peer that never reads | `a_peer_that_never_reads` | tests/bounds.rs, `item13_*` |
//! | RNG failure | not playable against a node (it has no entropy hook) | transport/tests/security.rs `item14_rng_failure_aborts_without_fallback` |
//! | Deep nesting (100k levels) | `deep_nesting_100k_levels` | envelope/tests/bad_input.rs |
//! | Length headers claiming 2^32..2^64 items | `length_claims_of_2_32_to_2_64` | envelope/tests/alloc_bounds.rs |
//! | Trailing bytes, tags, indefinite lengths, duplicate keys, non-minimal integers, unknown fields | `strict_profile_violations` | envelope/tests/bad_input.rs |
//! | Wrong types in cap/verb/req_id, empty or oversize strings, NUL bytes | `frame_field_types_and_strings`, `malformed_answers_to_the_nodes_calls` | envelope/tests/bad_input.rs |
//! | Unknown cap or verb, empty, other case, spaces, NUL, confusables, paths | `chokepoint_name_variants`, `frame_field_types_and_strings` | tests/dispatch.rs, authz/tests/chokepoint.rs |
//! | Controller verb from a non-controller, a former controller, racing an unbind | `controller_verbs_from_a_non_controller`, `a_former_controller_after_unbind`, `racing_an_unbind` | tests/dispatch.rs |
//! | Args that fail the verb's type (after authorization) | `args_failing_their_type` | tests/dispatch.rs |
//! | Authorizer panics or errors | `authorizer_panics_or_fails` | authz/tests/chokepoint.rs (also an unset authorizer) |
//! | A verb registered without an auth class | not playable over the wire: a typed verb always has one | manifest/tests/registry.rs `refuses_a_verb_without_auth_class` |
//! | Duplicate in-flight req_id, huge req_id, no correlation hijack | `duplicate_in_flight_req_id`, `huge_and_odd_req_ids`, `response_hijack_of_another_peers_call` | tests/calls.rs |
//! | Repeated completed req_id; the same req_id on another verb | `repeated_completed_req_id`, `same_req_id_on_another_verb` | tests/calls.rs, tests/replay.rs |
//! | Another sender flooding the ledger | `another_sender_floods_the_ledger`, `durable_answers_are_per_sender` | tests/replay.rs, tests/core_caps.rs |
//! | A request verb with an empty req_id | `request_verb_with_an_empty_req_id` | |
//! | Shutdown while peers stall, never read, or finish a handshake mid-shutdown | `shutdown_while_peers_stall` | tests/shutdown.rs |
//! | Bind: wrong code 3 times, expired, wrong sender, no pending, two at once | `bind_wrong_code_three_times`, `wrong_codes_at_once_get_three_attempts_in_all`, `bind_with_an_expired_code`, `bind_from_the_wrong_sender`, `bind_without_a_pending_bind`, `control_planes_binding_at_once` | tests/dispatch.rs, authz/tests/bind.rs |
//! | A peer killed mid-request | `peer_cut_mid_request` | tests/calls.rs |
//! | A network partition between two hosts | `network_partition` (a link that goes silent, then a new one) | |
//! | Streams, the node as callee (WIRE.md 4.9): a caller that never grants credit, grants absurd credit (2^32-1 again and again, and beyond it), or grants for streams that are not open | `a_caller_that_never_grants_credit`, `a_caller_that_grants_absurd_credit`, `credit_for_streams_that_are_not_open` | tests/streams.rs, src/proto/streams.rs unit tests |
//! | Streams: 10,000 opened at once (beyond `max_inflight`: `overloaded`; memory bounded; released when the peer leaves) | `ten_thousand_streams_at_once` | tests/bounds.rs (requests) |
//! | Streams: cancel racing the end, cancel twice, cancel then credit; a repeated `req_id` of an open and of an ended stream | `cancel_and_end_races`, `repeated_req_id_of_an_open_and_an_ended_stream` | tests/streams.rs |
//! | Streams on a version-1 session (`unknown_verb`; `item` and `credit` frames: `protocol_error`), and a stream verb sent as a notification (dropped) | `stream_verb_on_a_version_1_session`, `stream_frames_on_a_version_1_session`, `a_stream_verb_sent_as_a_notification` | tests/streams.rs |
//! | Streams, the node as caller: items beyond the credit (items, bytes, one item over the window), an item for one of the node's plain requests | `items_beyond_the_credit`, `an_item_for_one_of_the_nodes_requests` | src/proto/session.rs unit tests |
//! | Streams, the node as caller: items for streams that do not exist or were cancelled, a stream ended twice and fed after its end, a flood within credit while the application does not read | `items_for_streams_that_do_not_exist`, `a_stream_ended_twice_then_fed`, `a_flood_within_credit_while_the_caller_does_not_read` | tests/sim.rs `a_partition_mid_stream_ends_it_on_both_sides` |
//! | Tasks (WIRE.md 4.10): another sender probes a task's id with every verb of `core.tasks` (answered byte for byte as a random id); ids that are not 32 lowercase hex digits | `probing_the_task_ids_of_others`, `malformed_task_ids` | tests/tasks.rs |
//! | Tasks: a submit flood past `max_tasks_per_sender` and `max_tasks` (`overloaded`, no task, others served); args, progress, results and answers past `max_task_body` (`too_large`; the task ends `failed`, never stuck) | `a_submit_flood_past_the_task_quotas`, `oversized_task_args_progress_and_results` | src/tasks/table.rs unit tests |
//! | Tasks: answers out of turn, of the wrong type (`bad_args`, the question still waits) and twice at once (one wins); cancels racing the end | `answers_out_of_turn_of_the_wrong_type_and_twice`, `cancel_racing_completion` | tests/tasks.rs |
//! | Tasks: subscriptions from seq 0, past the end and from 2^64-1; a subscriber that never grants credit; a log past `max_task_events` with a subscriber resuming across the fold | `subscribe_from_a_huge_or_zero_seq`, `a_subscriber_that_never_grants_credit`, `an_event_log_past_max_task_events` | src/store/tests.rs (folding in both stores) |
//! | Tasks on a version-1 session (`unknown_verb`), and a task verb sent as a notification (dropped) | `task_verbs_on_a_version_1_session` | tests/tasks.rs |
//! | Tasks: a submit retried after its session is cut, or after it was cancelled or given no budget (the same task, nothing started twice) | `a_submit_retried_after_the_session_is_cut`, `a_cancelled_submit_retried` | tests/task_crash.rs (kill -9 mid-task), tests/sim.rs `a_partition_mid_task_loses_no_event` |
//! | Tasks: `core.tasks/changed` pushes forged by a stranger, by the thousand (handed over with the stranger's key, the node's tasks untouched) | `forged_task_changes_from_a_stranger` | tests/tasks.rs |
//! | A node restarted (kill -9) while config writes are in flight | not in this harness: it needs a process to kill | tests/crash.rs `acknowledged_config_writes_survive_sigkill_and_retries_are_not_applied_twice` |
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "adversary/mod.rs"]
mod kit;

use std::alloc::System;
use std::time::Duration;

use kit::arena::{Played, Setup, run};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts the heap, so that an attack can tell that a length claim did
/// not turn into an allocation of that size.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;
use kit::{
    audit, bind, bounds, chokepoint, faults, frames, handshake, ledger, linger, records, streams,
    tasks, trace,
};

/// Declares the attacks: one test each, and the list of their names.
macro_rules! attacks {
    ($( $clock:ident $name:ident ( $setup:expr ) => $play:path ; )*) => {
        /// Every attack of the harness, by name.
        const ATTACKS: &[&str] = &[$(stringify!($name)),*];
        $( attacks!(@one $clock $name ($setup) => $play); )*
    };
    (@one real $name:ident ($setup:expr) => $play:path) => {
        #[tokio::test]
        async fn $name() {
            run(stringify!($name), $setup, |a| -> Played { Box::pin($play(a)) }).await;
        }
    };
    (@one paused $name:ident ($setup:expr) => $play:path) => {
        #[tokio::test(start_paused = true)]
        async fn $name() {
            run(stringify!($name), $setup, |a| -> Played { Box::pin($play(a)) }).await;
        }
    };
}

attacks! {
    // Transport messages and records.
    real length_prefix_over_the_handshake_limit(Setup::tcp())
        => records::length_prefix_over_the_handshake_limit;
    real length_prefix_shorter_than_a_tag(Setup::tcp())
        => records::length_prefix_shorter_than_a_tag;
    real record_announced_over_max_record(Setup::tcp())
        => records::record_announced_over_max_record;
    real large_records_are_split_never_truncated(Setup::tcp())
        => records::large_records_are_split_never_truncated;
    real record_rules_broken(Setup::tcp()) => records::record_rules_broken;
    real truncated_message_then_end_of_stream(Setup::tcp())
        => records::truncated_message_then_end_of_stream;
    real bit_flips_in_ciphertext_and_tag(Setup::tcp())
        => records::bit_flips_in_ciphertext_and_tag;
    real rekey_abuse(Setup::tcp()) => records::rekey_abuse;
    real replayed_reordered_duplicated_dropped_reflected(Setup::tcp())
        => records::replayed_reordered_duplicated_dropped_reflected;
    real nonce_exhaustion(Setup::tcp().transport(|t| t.start_nonce_for_testing = u64::MAX - 6))
        => records::nonce_exhaustion;
    paused slow_loris_and_silent_peers(Setup::memory()) => records::slow_loris_and_silent_peers;
    real an_idle_closed_peer_that_keeps_its_stream_open(Setup::memory().transport(|t| {
        t.idle_timeout = Duration::from_secs(1);
        t.keepalive_interval = Duration::from_millis(500);
    })) => linger::an_idle_closed_peer_that_keeps_its_stream_open;

    // The handshake.
    real handshake_messages_out_of_turn_repeated_short_long(Setup::tcp())
        => handshake::handshake_messages_out_of_turn_repeated_short_long;
    real replayed_and_reflected_handshakes(Setup::tcp())
        => handshake::replayed_and_reflected_handshakes;
    real prologue_or_protocol_name_mismatch(Setup::tcp())
        => handshake::prologue_or_protocol_name_mismatch;
    real low_order_ephemeral_keys(Setup::tcp()) => handshake::low_order_ephemeral_keys;
    real low_order_static_keys(Setup::tcp()) => handshake::low_order_static_keys;
    real static_keys_judged_in_canonical_form(handshake::contact_policy_setup())
        => handshake::static_keys_judged_in_canonical_form;
    real requests_before_a_valid_hello(Setup::tcp()) => handshake::requests_before_a_valid_hello;

    // Floods and bounds.
    real handshake_floods(Setup::tcp().transport(|t| {
        t.first_message_timeout = Duration::from_secs(1);
        t.handshake_timeout = Duration::from_secs(2);
    })) => bounds::handshake_floods;
    real accept_rate_flood(
        Setup::tcp()
            .limits(|l| {
                l.accept_rate = 20;
                l.accept_burst = 10;
                l.max_handshakes_per_source = 1000;
            })
            .transport(|t| t.first_message_timeout = Duration::from_secs(1))
    ) => bounds::accept_rate_flood;
    real throwaway_keys_fill_the_session_budget(Setup::tcp().bound().limits(|l| {
        l.max_inbound_sessions = 3;
        l.reserved_sessions = 2;
    })) => bounds::throwaway_keys_fill_the_session_budget;
    real a_peer_that_never_reads(Setup::tcp().limits(|l| {
        l.max_inflight_per_session = 16;
        l.max_queued_bytes_per_session = 256 * 1024;
        l.write_timeout = Duration::from_secs(2);
    })) => bounds::a_peer_that_never_reads;
    paused shutdown_while_peers_stall(
        Setup::memory().limits(|l| l.shutdown_grace = Duration::from_secs(2))
    ) => bounds::shutdown_while_peers_stall;

    // CBOR and envelopes.
    real deep_nesting_100k_levels(Setup::tcp()) => frames::deep_nesting_100k_levels;
    real length_claims_of_2_32_to_2_64(Setup::tcp()) => frames::length_claims_of_2_32_to_2_64;
    real strict_profile_violations(Setup::tcp()) => frames::strict_profile_violations;
    real frame_field_types_and_strings(Setup::tcp()) => frames::frame_field_types_and_strings;

    // The chokepoint.
    real chokepoint_name_variants(Setup::tcp().bound()) => chokepoint::chokepoint_name_variants;
    real controller_verbs_from_a_non_controller(Setup::tcp().bound())
        => chokepoint::controller_verbs_from_a_non_controller;
    real a_former_controller_after_unbind(Setup::tcp())
        => chokepoint::a_former_controller_after_unbind;
    real racing_an_unbind(Setup::tcp()) => chokepoint::racing_an_unbind;
    real args_failing_their_type(Setup::tcp().bound()) => chokepoint::args_failing_their_type;
    real authorizer_panics_or_fails(chokepoint::hostile_authorizer_setup())
        => chokepoint::authorizer_panics_or_fails;

    // The replay ledger.
    real duplicate_in_flight_req_id(Setup::tcp()) => ledger::duplicate_in_flight_req_id;
    real huge_and_odd_req_ids(Setup::tcp()) => ledger::huge_and_odd_req_ids;
    real repeated_completed_req_id(Setup::tcp()) => ledger::repeated_completed_req_id;
    real same_req_id_on_another_verb(Setup::tcp()) => ledger::same_req_id_on_another_verb;
    real another_sender_floods_the_ledger(
        Setup::tcp().limits(|l| l.replay_sender_max_bytes = 64 * 1024)
    ) => ledger::another_sender_floods_the_ledger;
    real request_verb_with_an_empty_req_id(Setup::tcp())
        => ledger::request_verb_with_an_empty_req_id;
    real response_hijack_of_another_peers_call(Setup::tcp())
        => ledger::response_hijack_of_another_peers_call;
    real durable_answers_are_per_sender(Setup::tcp()) => ledger::durable_answers_are_per_sender;
    real malformed_answers_to_the_nodes_calls(Setup::tcp())
        => ledger::malformed_answers_to_the_nodes_calls;

    // Protocol 3 and the audit log.
    real a_version_2_control_plane_never_sees_core_audit(Setup::tcp())
        => audit::a_version_2_control_plane_never_sees_core_audit;
    real a_version_3_stranger_is_refused_the_audit_log(Setup::tcp().bound())
        => audit::a_version_3_stranger_is_refused_the_audit_log;
    real a_hello_showing_core_audit_under_protocol_2(Setup::tcp())
        => audit::a_hello_showing_core_audit_under_protocol_2;
    real a_trace_context_never_costs_a_call(Setup::tcp())
        => audit::a_trace_context_never_costs_a_call;

    // Trace contexts, each way.
    real a_malformed_traceparent_is_dropped_and_counted(Setup::tcp())
        => trace::a_malformed_traceparent_is_dropped_and_counted;
    real an_all_zero_trace_id_is_dropped_and_counted(Setup::tcp())
        => trace::an_all_zero_trace_id_is_dropped_and_counted;
    real an_oversize_tracestate_is_dropped_and_counted(Setup::tcp())
        => trace::an_oversize_tracestate_is_dropped_and_counted;
    real a_tracestate_of_33_members_is_dropped_and_counted(Setup::tcp())
        => trace::a_tracestate_of_33_members_is_dropped_and_counted;
    real a_trace_item_that_is_no_map_is_dropped_and_counted(Setup::tcp())
        => trace::a_trace_item_that_is_no_map_is_dropped_and_counted;
    real a_context_on_a_protocol_2_session_is_dropped_and_counted(Setup::tcp())
        => trace::a_context_on_a_protocol_2_session_is_dropped_and_counted;
    real no_trace_item_goes_to_a_peer_below_protocol_3(Setup::tcp())
        => trace::no_trace_item_goes_to_a_peer_below_protocol_3;
    real a_trace_item_goes_to_a_protocol_3_peer(Setup::tcp())
        => trace::a_trace_item_goes_to_a_protocol_3_peer;

    // The bind ceremony.
    real bind_wrong_code_three_times(Setup::tcp()) => bind::bind_wrong_code_three_times;
    paused bind_with_an_expired_code(Setup::memory()) => bind::bind_with_an_expired_code;
    real bind_from_the_wrong_sender(Setup::tcp()) => bind::bind_from_the_wrong_sender;
    real bind_without_a_pending_bind(Setup::tcp()) => bind::bind_without_a_pending_bind;
    real control_planes_binding_at_once(Setup::tcp()) => bind::control_planes_binding_at_once;
    real wrong_codes_at_once_get_three_attempts_in_all(Setup::tcp())
        => bind::wrong_codes_at_once_get_three_attempts_in_all;

    // Streams, the node as callee.
    real a_caller_that_never_grants_credit(
        streams_setup().limits(|l| l.stream_idle_timeout = Duration::from_millis(300))
    ) => streams::a_caller_that_never_grants_credit;
    real a_caller_that_grants_absurd_credit(Setup::memory().limits(|l| {
        l.max_queued_bytes_per_session = 64 * 1024;
        l.stream_idle_timeout = Duration::from_secs(10);
    })) => streams::a_caller_that_grants_absurd_credit;
    real credit_for_streams_that_are_not_open(streams_setup())
        => streams::credit_for_streams_that_are_not_open;
    real ten_thousand_streams_at_once(Setup::tcp().limits(|l| {
        l.stream_idle_timeout = Duration::from_secs(30);
    })) => streams::ten_thousand_streams_at_once;
    real cancel_and_end_races(streams_setup()) => streams::cancel_and_end_races;
    real repeated_req_id_of_an_open_and_an_ended_stream(streams_setup())
        => streams::repeated_req_id_of_an_open_and_an_ended_stream;
    real stream_verb_on_a_version_1_session(streams_setup())
        => streams::stream_verb_on_a_version_1_session;
    real stream_frames_on_a_version_1_session(streams_setup())
        => streams::stream_frames_on_a_version_1_session;
    real a_stream_verb_sent_as_a_notification(streams_setup())
        => streams::a_stream_verb_sent_as_a_notification;

    // Streams, the node as caller.
    // A caller's idle bound below the close timeout: the stream must end
    // with the session's close, not with the caller giving up.
    real items_beyond_the_credit(
        streams_setup().limits(|l| l.stream_idle_timeout = Duration::from_millis(800))
    ) => streams::items_beyond_the_credit;
    real an_item_for_one_of_the_nodes_requests(streams_setup())
        => streams::an_item_for_one_of_the_nodes_requests;
    real items_for_streams_that_do_not_exist(streams_setup())
        => streams::items_for_streams_that_do_not_exist;
    real a_stream_ended_twice_then_fed(streams_setup())
        => streams::a_stream_ended_twice_then_fed;
    real a_flood_within_credit_while_the_caller_does_not_read(streams_setup())
        => streams::a_flood_within_credit_while_the_caller_does_not_read;

    // Tasks.
    real probing_the_task_ids_of_others(tasks::tasks_setup())
        => tasks::probing_the_task_ids_of_others;
    real malformed_task_ids(tasks::tasks_setup()) => tasks::malformed_task_ids;
    real a_submit_flood_past_the_task_quotas(tasks::tasks_setup().limits(|l| {
        l.max_tasks = 8;
        l.max_tasks_per_sender = 4;
    })) => tasks::a_submit_flood_past_the_task_quotas;
    real oversized_task_args_progress_and_results(tasks::tasks_setup())
        => tasks::oversized_task_args_progress_and_results;
    real answers_out_of_turn_of_the_wrong_type_and_twice(tasks::tasks_setup())
        => tasks::answers_out_of_turn_of_the_wrong_type_and_twice;
    real cancel_racing_completion(tasks::tasks_setup()) => tasks::cancel_racing_completion;
    real subscribe_from_a_huge_or_zero_seq(tasks::tasks_setup())
        => tasks::subscribe_from_a_huge_or_zero_seq;
    real a_subscriber_that_never_grants_credit(
        tasks::tasks_setup().limits(|l| l.stream_idle_timeout = Duration::from_secs(1))
    ) => tasks::a_subscriber_that_never_grants_credit;
    real an_event_log_past_max_task_events(tasks::tasks_setup())
        => tasks::an_event_log_past_max_task_events;
    real task_verbs_on_a_version_1_session(tasks::tasks_setup())
        => tasks::task_verbs_on_a_version_1_session;
    real a_submit_retried_after_the_session_is_cut(
        tasks::tasks_setup().limits(|l| l.replay_window = Duration::from_secs(1))
    ) => tasks::a_submit_retried_after_the_session_is_cut;
    real a_cancelled_submit_retried(tasks::tasks_setup()) => tasks::a_cancelled_submit_retried;
    real forged_task_changes_from_a_stranger(tasks::tasks_setup())
        => tasks::forged_task_changes_from_a_stranger;

    // Faults.
    real peer_cut_mid_request(Setup::tcp()) => faults::peer_cut_mid_request;
    paused network_partition(Setup::memory()) => faults::network_partition;
}

/// The node of the stream attacks: a small window for the streams it
/// calls (8 items, 256 bytes), and an idle bound for streams (10 s) that
/// no attack waits for but the one that is about it.
fn streams_setup() -> Setup {
    Setup::tcp().limits(|l| {
        l.stream_idle_timeout = Duration::from_secs(10);
        l.stream_window_items = 8;
        l.stream_window_bytes = 256;
    })
}

/// Every row of the coverage table above names attacks that exist, and
/// every attack is in some row (the table in the docs is this one).
#[test]
fn the_coverage_table_names_every_attack_and_only_attacks() {
    let doc = include_str!("adversary.rs");
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("//! | ") && !l.starts_with("//! | SECURITY"))
        .collect();
    assert!(rows.len() >= 30, "{} rows", rows.len());
    let mut named = Vec::new();
    for row in &rows {
        let attacks = row.split(" | ").nth(2).unwrap();
        for part in attacks.split('`').skip(1).step_by(2) {
            named.push(part);
        }
    }
    for attack in ATTACKS {
        assert!(named.contains(attack), "{attack} is in no row");
    }
    for n in &named {
        assert!(
            ATTACKS.contains(n),
            "the table names {n}, which is no attack"
        );
    }
}
