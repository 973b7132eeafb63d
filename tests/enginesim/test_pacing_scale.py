"""The per-case time scale leaves room for what the emulator's one process must do inside a TTFT."""

from __future__ import annotations

from enginesim.pacing import TTFT_SHARE, Box, choose_scale

# The embedded cold_prefill_128k case as the replay sees it (Qwen3-0.6B, h200, 2 requests at C=1).
PROFILE_128K = {
    "emulated_s": 7.169,
    "ttft_p50_s": 3.5847,
    "first_step_s": 0.224,
    "step_p05_s": 0.044,
    "step_rate_p95": 22.0,
    "event_rate_p95": 0.5,
}
# Measured on a quiet box (load 0.8, CPU share 0.99): reading one 131,072-token prompt took 42 ms of wall.
MEASURED_READ_128K_S = 0.042


def test_a_128k_prompt_read_stays_inside_the_ttft_share() -> None:
    quiet = Box(cpu_share=0.99, sleep_jitter_s=0.0005, probe_s=0.086)
    scale, why = choose_scale(PROFILE_128K, quiet, backend="sglang", max_case_s=60.0, burst=1, isl=131072)
    wall_ttft = PROFILE_128K["ttft_p50_s"] * scale
    assert MEASURED_READ_128K_S / wall_ttft <= TTFT_SHARE, (scale, why)
    assert why["set_by"] == "intake"


def test_a_busy_box_needs_a_larger_scale_and_the_cap_is_reported() -> None:
    quiet = Box(cpu_share=0.99, sleep_jitter_s=0.0005, probe_s=0.086)
    busy = Box(cpu_share=0.25, sleep_jitter_s=0.004, probe_s=0.3)
    quiet_scale, _ = choose_scale(PROFILE_128K, quiet, isl=131072, burst=1)
    busy_scale, _ = choose_scale(PROFILE_128K, busy, isl=131072, burst=1)
    assert busy_scale > 3 * quiet_scale
    capped, why = choose_scale(PROFILE_128K, busy, isl=131072, burst=1, max_case_s=5.0)
    assert capped < busy_scale
    assert why["capped"]["needed_scale"] == busy_scale
