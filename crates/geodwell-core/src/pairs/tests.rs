//! Unit tests of the pair state machine: runs of fixes and internal events through one record,
//! threshold remapping, and the packed timer and time fields.

use super::*;

fn settings(dwell: &[i64]) -> FenceSettings {
    FenceSettings {
        dwell: dwell.iter().map(|s| Dur::from_secs(*s)).collect(),
        exit_buffer_m: 0.0,
        enter_confirm: 1,
        exit_confirm: 1,
        confirm_within: Dur::from_mins(5),
        stale_after: Some(Dur::from_mins(15)),
        max_accuracy_m: None,
        tags: std::sync::Arc::new(serde_json::json!({})),
        devices: Default::default(),
    }
}

fn run(p: &mut Pair, s: &FenceSettings, steps: &[(i64, Option<FixClass>)]) -> Vec<PairOutput> {
    let mut out = Vec::new();
    let mut last = Some(p.entered_at());
    for &(t, class) in steps {
        let ts = Ts(t * 1000);
        p.catch_up(s, ts, last, &mut |o| out.push(o));
        if let Some(c) = class {
            last = Some(ts);
            p.on_fix(s, ts, c, &mut |o| out.push(o));
        }
    }
    out
}

#[test]
fn enter_then_dwell_then_exit() {
    let s = settings(&[60]);
    let mut out = Vec::new();
    let mut p = Pair::start(FenceIdx(0), &s, Ts(0), &mut |o| out.push(o));
    assert_eq!(out, vec![PairOutput::Enter { entered_at: Ts(0) }]);
    let got = run(
        &mut p,
        &s,
        &[
            (30, Some(FixClass::Inside)),
            (61, None),
            (90, Some(FixClass::Outside)),
        ],
    );
    assert_eq!(
        got,
        vec![
            PairOutput::Dwell {
                entered_at: Ts(0),
                threshold: Dur::from_secs(60)
            },
            PairOutput::Exit {
                entered_at: Ts(0),
                at: Ts(90_000)
            },
        ]
    );
}

#[test]
fn remap_keeps_fired_state_of_unchanged_thresholds() {
    let s = settings(&[60, 120]);
    let mut out = Vec::new();
    let mut p = Pair::start(FenceIdx(0), &s, Ts(0), &mut |o| out.push(o));
    run(&mut p, &s, &[(61, Some(FixClass::Inside))]);
    assert_eq!(p.fired, 0b1);
    let s2 = FenceSettings {
        dwell: vec![Dur::from_secs(30), Dur::from_secs(60)],
        ..s.clone()
    };
    let got = run_remap(&mut p, &s, &s2);
    assert_eq!((p.evaluated, p.fired), (2, 0b11));
    assert_eq!(
        got,
        vec![PairOutput::Dwell {
            entered_at: Ts(0),
            threshold: Dur::from_secs(30)
        }],
        "only the new, already passed threshold fires"
    );
}

fn run_remap(p: &mut Pair, old: &FenceSettings, new: &FenceSettings) -> Vec<PairOutput> {
    let mut out = Vec::new();
    p.remap_thresholds(&old.dwell, new, Some(Ts(61_000)), &mut |o| out.push(o));
    out
}

#[test]
fn timer_low_bits_identify_the_tick_near_the_wheel_and_never_far_from_it() {
    let s = FenceSettings::default();
    let mut p = Pair::start(FenceIdx(0), &s, Ts(0), &mut |_| {});
    assert!(p.timer_is(None, 5) && !p.has_timer());
    for base in [0u64, (1 << 24) - 10, u64::from(u32::MAX) - 10, 1 << 40] {
        // Across the wrap of the stored low bits.
        p.set_timer(Some(base + 100), base);
        assert!(p.has_timer());
        assert!(p.timer_is(Some(base + 100), base));
        assert!(p.timer_is(Some(base + 100), base + 50));
        assert!(!p.timer_is(Some(base + 101), base));
        assert!(!p.timer_is(None, base));
        // Same low bits, 2^24 ticks apart: not the same tick.
        assert!(!p.timer_is(Some(base + 100 + (1 << 24)), base + 50));
        // A far timer is never taken for the same one, so it is always rescheduled.
        p.set_timer(Some(base + (1 << 23)), base);
        assert!(p.has_timer());
        assert!(!p.timer_is(Some(base + (1 << 23)), base));
        p.set_timer(None, base);
        assert!(!p.has_timer() && p.timer_is(None, base));
    }
}

#[test]
fn packed_fields_round_trip() {
    let s = FenceSettings::default();
    for ts in [Ts::MIN, Ts(1_767_225_600_123), Ts::MAX] {
        assert_eq!(Ts48::new(ts).get(), ts);
    }
    let st = PairState {
        entered_at: Ts::MAX.0,
        vote_first: 1,
        vote_last: 2,
        votes: 99,
        inside: true,
        evaluated: 3,
        fired: 0b101,
        stale: 0b10,
    };
    let s3 = FenceSettings {
        dwell: vec![Dur::from_secs(1), Dur::from_secs(2), Dur::from_secs(3)],
        ..s
    };
    let p = Pair::from_state(FenceIdx(0), &st, &s3);
    assert_eq!(p.state(), st);
    assert!(p.is_inside());
}
