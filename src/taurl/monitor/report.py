"""report.html: one self-contained file (plots as base64 PNGs) of a training run.

Plots come from ``metrics.jsonl`` (one row per SFT step / RL update / evaluation) and
the validation and holdout results from ``summary.json``; nothing is fetched from the network.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taurl.data.runs import RunDir

# The keys the training pipeline adds to `taurl.monitor.metrics.GLOSSARY` (rollout/* there).
TRAIN_GLOSSARY: dict[str, str] = {
    "rollout/groups_same_reward": "share of groups whose G rewards are all equal (zero advantage "
                                  "under GRPO)",
    "learn/loss": "total loss of the update: policy loss + β·KL − entropy bonus, token-weighted "
                  "over micro-batches",
    "learn/pg_loss": "the objective's policy-gradient loss (PPO clipped surrogate by default)",
    "learn/clip_frac": "share of action tokens where the PPO clip is active (ratio outside "
                       "[1−ε_low, 1+ε_high])",
    "learn/approx_kl": "mean over action tokens of (r − 1) − log r, r = π_θ/π_old (k3 estimate of "
                       "KL(π_old‖π_θ))",
    "learn/kl_k3": "mean k3 estimate of KL(π_θ ‖ π_ref) to the frozen SFT policy (when kl_coef "
                   "> 0)",
    "learn/entropy": "mean policy entropy H(π(·|x_<t)) over action tokens",
    "learn/grad_norm": "global gradient norm before clipping",
    "learn/lr": "the learning rate of the update's optimizer step (lr, or less during "
                "lr_warmup_steps)",
    "learn/tokens_per_s": "real (non-padding) tokens through forward+backward / learn seconds",
    "learn/padding_frac": "padding tokens / all tokens of the micro-batches",
    "learn/skipped": "1 when every group had identical rewards, so no step was taken",
    "learn/ranks": "learner ranks of the update (train.strategy ddp / fsdp; absent: one process)",
    "learn/rows": "trajectories left after the zero-variance group filter",
    "learn/invalid_samples_dropped": "episodes ended by an error the agent did not cause (valid = "
                                     "false), left out of the loss",
    "sft/invalid_samples_dropped": "the same for SFT: demonstrations ended by an error are not "
                                   "imitated",
    "sft/skipped": "1 when an SFT batch held no valid sample, so no step was taken",
    "run/reused_episodes": "episodes of the round found in the ledger (a resumed run)",
    "run/recovered_row": "1 on a row a resumed run wrote from its checkpoint (the run was killed "
                         "between the two; no timings)",
    "ray/workers, ray/worker_deaths, ray/worker_restarts": "backend: ray — live rollout workers "
                                                           "after the update / worker processes "
                                                           "that died in it / of those, restarted "
                                                           "(a new process answered)",
    "ray/rerun_episodes": "backend: ray — episodes sent again (same id and seed) because their "
                          "worker died before returning them",
    "time/ray_startup_s": "backend: ray — seconds to start the cluster and its rollout workers "
                          "(first update's row only)",
    "rollout/failed_episodes": "episodes that produced no record (an exception or a ledger "
                               "rejection), logged",
    "time/rollout_s, time/learn_s, time/checkpoint_s": "seconds of the update spent on each",
    "mem/rollout_peak_rss_mb, mem/learn_peak_rss_mb, mem/checkpoint_peak_rss_mb":
        "peak resident memory (MB) of the process in each phase of the update (VmHWM reset at "
        "the phase's start; taurl.monitor.memory)",
    "copy/loss": "copy warm-up: token-mean NLL of the copied name (taurl.train.copy_warmup)",
    "copy/exact_unseen": "copy warm-up: share of names it never trained on copied exactly (greedy)",
    "sft/loss": "token-mean NLL of the demonstrations' action tokens",
    "eval/success": "successes / expected episodes under the env's verifier (task-clustered 95% CI "
                    "in eval/ci95_*); a missing episode is a failure",
    "eval/ci95_iid_low, eval/ci95_iid_high": "the Wilson interval that treats episodes as "
                                             "independent (for comparison only)",
    "eval/design_effect": "deff: cluster-robust variance over tasks / binomial variance (1 = "
                          "trials independent)",
    "eval/effective_n": "n* = N/deff·(1.96/t_{G−1})², the sample size the clustered interval is "
                        "Wilson's at",
    "eval/episodes_missing": "expected episodes (tasks × trials) that produced no record; counted "
                             "as failures",
    "eval/invalid_episodes": "episodes ended by an error the agent did not cause",
    "eval/pass_at_k": "unbiased pass@k over the k trials per task (Chen et al. 2021)",
    "eval/violation_rate, eval/cheat_rate": "episodes with a constraint violation / with a "
                                            "verifier-detected cheat, over recorded episodes",
    "eval/gate_denials_mean, eval/tool_errors_mean": "tool calls the host gate denied / that "
                                                     "failed (error, timeout), per episode",
    "eval/tokens_per_success, eval/tool_calls_per_success, eval/wall_s_per_success":
        "Σ over recorded episodes / verified successes (absent: no success)",
    "alarm/<name>": "1 when the health alarm <name> fires at this RL update, else 0 "
                    "(taurl.monitor.alarms)",
    "rollout/staleness_max": "max over the batch's episodes of (sampling version − the oldest "
                             "version in the episode)",
    "learn/prm_pairs, learn/prm_steps": "step_scorer: implicit_prm — (success, failure) pairs of "
                                        "the batch's groups / DPO steps φ took on them",
    "learn/prm_dpo_loss, learn/prm_dpo_reward_acc": "φ's trajectory-DPO loss and share of pairs "
                                                    "with β·Δlog-ratio > 0 (reference π_old)",
    "learn/prm_step_reward_mean, learn/prm_step_reward_gap": "mean implicit step reward q = "
                                                             "β·Σ_turn(log π_φ − log π_old); mean "
                                                             "q of successful minus failed "
                                                             "episodes' turns",
    "learn/prm_shaping_abs_per_turn, learn/prm_clip_frac": "mean |p| over real turns of the "
                                                           "centred shaping p; share of turns "
                                                           "whose w·q hit the clip",
    "learn/prm_shaping_sum_abs_max": "max over episodes of |Σ_t p_t| (0 up to rounding: the "
                                     "shaping never changes an episode's total)",
    "replay/groups, replay/episodes, replay/share": "replay — stored groups mixed into this update "
                                                    "/ their episodes / their share of the trained "
                                                    "batch",
    "replay/age_mean, replay/age_max": "replay — policy versions between the replayed groups' "
                                       "sampling and now",
    "replay/expired_age, replay/expired_env, replay/evicted_total": "replay — groups dropped this "
                                                                    "update as older than max_age "
                                                                    "/ of another env version; "
                                                                    "groups pushed out by capacity "
                                                                    "(cumulative)",
    "curriculum/easy, curriculum/medium, curriculum/hard": "curriculum — tasks of each difficulty "
                                                           "bucket drawn for this update (the mix)",
    "curriculum/pool_<bucket>, curriculum/unseen": "curriculum — RL-pool tasks in each bucket "
                                                   "before the draw; pool tasks never seen yet",
    "learn/filter_zero_adv_groups_dropped": "groups dropped by drop_zero_variance: every advantage "
                                            "of every member is 0 (the advantages trained on, so "
                                            "step-level credit keeps a group of one outcome)",
    "learn/filter_zero_var_groups, learn/filter_zero_var_groups_kept": "groups whose members share "
                                                                       "one outcome / of those, "
                                                                       "kept because their "
                                                                       "step-level advantages are "
                                                                       "not 0 (gigpo, gae)",
    "learn/vf_loss": "estimator gae — the critic's clipped value loss ½·max((V−R)², "
                     "(V_old+clip(V−V_old, ±vf_clip)−R)²), mean over real turns",
    "learn/vf_explained_var, learn/value_explained_var": "estimator gae — 1 − Var(R − V)/Var(R) "
                                                         "over real turns, during the critic's "
                                                         "update / before it",
    "learn/value_mean": "estimator gae — mean V(s_t) the critic gave the turns of the batch",
    "learn/bootstrapped_rows": "estimator gae — truncated episodes whose GAE was bootstrapped from "
                               "V(s_T) (terminated ones never are)",
    "mismatch/abs_mean, mismatch/abs_max": "mean / max over action tokens of |learner logprob − "
                                           "behaviour logprob| before the update's first step, on "
                                           "the rows the learner's own version sampled "
                                           "(mismatch/tokens counts them)",
    "mismatch/kl, mismatch/clip_share": "k3 estimate of KL(behaviour ‖ learner); share of tokens "
                                        "whose ratio is already outside the clip range",
    "learn/is_bounded_frac": "objective decoupled_ppo — share of action tokens whose weight "
                             "π_prox/μ was truncated (w > is_cap) or masked (outside [is_floor, "
                             "is_cap])",
    "learn/is_weight_mean, learn/is_weight_max_raw": "objective decoupled_ppo — mean bounded "
                                                     "weight over action tokens; largest weight "
                                                     "before the bound",
    "learn/behaviour_kl": "objective decoupled_ppo — k3 estimate of KL(μ ‖ π_prox): mean of (w − "
                          "1) − log w, w = π_prox/μ per token",
    "learn/staleness_mean, learn/staleness_p95, learn/staleness_max": "over the batch's episodes: "
                                                                      "learner version − the "
                                                                      "oldest version among the "
                                                                      "episode's action segments "
                                                                      "(nearest-rank p95)",
    "rollout/staleness_mean, rollout/staleness_p95": "schedule async — ages of the trained batch's "
                                                     "episodes (mean, nearest-rank p95)",
    "rollout/dropped_stale_groups, rollout/dropped_stale_episodes": "schedule async — groups / "
                                                                    "episodes refused at "
                                                                    "consumption as older than "
                                                                    "staleness_eta",
    "rollout/aborted_groups, rollout/carried_groups": "schedule async — in-flight groups aborted "
                                                      "once they could not be fresh / groups in "
                                                      "flight or ready when the batch was taken",
    "rollout/trained_action_tokens": "schedule async — action tokens of the trained batch",
    "time/learner_idle_s": "schedule async — seconds the learner waited for a batch",
    "eval/tool_error_rate, eval/wall_s_mean": "failed / all tool calls; mean of the episodes' own "
                                              "wall seconds",
    "phase, step, time, update": "the row's phase (env_check, warmup, demos, sft, "
                                 "eval_<split>-<tag>, rl), step, unix time and RL update",
    "env/check_passed, env/check_s, env/check_task": "env_check — 1 when check_env passed on the "
                                                     "run's env before any work; its seconds; the "
                                                     "task it ran on",
    "policy/version": "rl — the version the update wrote (its checkpoint, served for the next "
                      "batch)",
    "demos/<key>": "the rollout/<key> figures of the demonstrations: the expert played through the "
                   "real loop",
    "learn/groups, learn/groups_zero_std, learn/groups_singleton": "groups in the credited batch / "
                                                                   "of those, all members equal "
                                                                   "(no group-relative signal) / "
                                                                   "with one member",
    "learn/adv_mean, learn/adv_std, learn/adv_abs_max, learn/adv_zero_frac": "mean, population "
                                                                             "std, max |A| and "
                                                                             "share of zeros of "
                                                                             "the advantages over "
                                                                             "real turns",
    "learn/filter_zero_adv_groups_kept, learn/filter_zero_adv_rows_dropped": "drop_zero_variance — "
                                                                             "groups kept; "
                                                                             "episodes dropped "
                                                                             "with their groups",
    "learn/action_tokens, learn/learn_s": "action tokens the update trained on; seconds of the "
                                          "learner's update (also time/learn_s)",
    "learn/staleness_episodes": "episodes with an age (demonstrations have none) behind "
                                "learn/staleness_*",
    "mismatch/tokens": "action tokens the mismatch/* figures read (0: none of the batch was "
                       "sampled by the learner's own version)",
    "mismatch/tis_weight_mean, mismatch/tis_clipped_frac": (
        "rl.tis on (auto: learner and engine numerics differ) — mean over action tokens of "
        "the truncated weight min(π_learner/μ_engine, C); share of tokens with π/μ > C "
        "(taurl.train.mismatch.tis_stats)"),
    "mismatch/weight_gap_before, mismatch/weight_gap_after": (
        "rl.tis on — mean |π/μ − 1|: how far the uncorrected gradient's token weight (1) is "
        "from exact importance sampling; mean max(0, π/μ − C): the part truncated IS leaves"),
    "mem/learn_cuda_peak_mb": (
        "CUDA only — torch.cuda.max_memory_allocated (MB) during the learn phase (peak reset "
        "at its start)"),
    "sft/action_tokens, sft/grad_norm, sft/lr, sft/elapsed_s": "per SFT step — action tokens "
                                                               "trained on, gradient norm before "
                                                               "clipping, learning rate, seconds "
                                                               "since SFT began",
    "time/update_s": "seconds of the whole update: rollout, learn, checkpoint, serve",
    "rollout/shrunk_groups": "groups left with fewer records than episodes (a counted failure took "
                             "a member); trained as they are",
    "eval/<EvalResult field>": "every number of an evaluation (taurl.eval.evaluate.EvalResult: "
                               "episodes, tasks, trials, turns_mean, score_mean, "
                               "verifier_disagreements, policy_version, eval_seed, temperature, "
                               "...) and eval/ci95_low, eval/ci95_high",
}

CURVES: list[tuple[str, list[str]]] = [
    ("RL rollouts: reward and success", ["rollout/reward_mean", "rollout/success"]),
    ("Strategy: search rate and tool calls", ["rollout/search_rate", "rollout/tool_calls_mean"]),
    ("Groups with identical rewards, invalid and truncation rates",
     ["rollout/groups_same_reward", "rollout/invalid_rate", "rollout/truncation_rate"]),
    ("Policy loss and clip fraction", ["learn/pg_loss", "learn/clip_frac"]),
    ("Approx KL (k3) to the behaviour policy, entropy", ["learn/approx_kl", "learn/entropy"]),
    ("Gradient norm", ["learn/grad_norm"]),
    ("Episode length (tokens)", ["rollout/tokens_mean", "rollout/action_tokens_mean"]),
    ("Time per update (s): rollout / learn / checkpoint",
     ["time/rollout_s", "time/learn_s", "time/checkpoint_s"]),
    ("Peak memory per phase (MB RSS): rollout / learn / checkpoint",
     ["mem/rollout_peak_rss_mb", "mem/learn_peak_rss_mb", "mem/checkpoint_peak_rss_mb"]),
]


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def curve_figures(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, base64 PNG) of each training curve that has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for phase, key, title, ylabel in (("warmup", "copy/loss", "Copy warm-up loss",
                                       "NLL of the copy"),
                                      ("sft", "sft/loss", "SFT loss", "NLL of action tokens")):
        # a run resumed after a crash in SFT redoes the warm-up and SFT: plot the last try
        last = {r["step"]: r for r in rows if r.get("phase") == phase and key in r}
        pts = [last[k] for k in sorted(last)]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.plot([r["step"] for r in pts], [r[key] for r in pts])
        ax.set_xlabel(f"{title.rsplit(' ', 1)[0]} step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        out.append((title, _png(fig)))
        plt.close(fig)
    grpo = [r for r in rows if r.get("phase") == "rl"]
    for title, keys in CURVES:
        present = [k for k in keys if any(k in r for r in grpo)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 3))
        for k in present:
            pts = [(r["update"], r[k]) for r in grpo if k in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=k)
        ax.set_xlabel("RL update")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        out.append((title, _png(fig)))
        plt.close(fig)
    return out


def holdout_figure(summary: dict[str, Any]) -> str | None:
    """Bar chart of holdout success (95% Wilson intervals) and search rate, SFT vs final."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = summary.get("holdout", {})
    tags = [t for t in ("sft", "final") if t in h]
    if not tags:
        return None
    fig, ax = plt.subplots(figsize=(6, 3))
    xs = range(len(tags))
    succ = [h[t]["success"] for t in tags]
    err = [[s - h[t]["ci95"][0] for s, t in zip(succ, tags, strict=True)],
           [h[t]["ci95"][1] - s for s, t in zip(succ, tags, strict=True)]]
    ax.bar([x - 0.2 for x in xs], succ, width=0.4, yerr=err, capsize=4, label="success (95% CI)")
    ax.bar([x + 0.2 for x in xs], [h[t]["search_rate"] for t in tags], width=0.4,
           label="search rate")
    ax.set_xticks(list(xs), [f"{t} ({h[t]['episodes']} ep.)" for t in tags])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    png = _png(fig)
    plt.close(fig)
    return png


# safety and cost of every evaluation (taurl.eval.evaluate.safety_figures / cost_figures)
SAFETY_COST_KEYS = ["violation_rate", "cheat_rate", "gate_denials_mean", "tool_errors_mean",
                    "tool_error_rate",
                    "wall_s_mean", "tokens_per_success", "tool_calls_per_success",
                    "wall_s_per_success"]


def promotion_section(summary: dict[str, Any]) -> str:
    """The promotion gate's decision (summary["promotion"], a promotions.jsonl record): the
    decision, the versions, and every rule with its reason and thresholds."""
    p = summary.get("promotion")
    if not p:
        return ""
    rows = "".join(f"<tr><th>{html.escape(c['rule'])}</th>"
                   f"<td>{'pass' if c['passed'] else '<b>FAIL</b>'}</td>"
                   f"<td style='text-align:left'>{html.escape(c['reason'])}</td></tr>"
                   for c in p.get("checks", []))
    thr = ", ".join(f"{k} {v:g}" for k, v in p.get("thresholds", {}).items())
    base = f"v{p['baseline']}" if p.get("baseline") is not None else "-"
    return (f"<h2>Promotion</h2><p id='promotion'><b>{html.escape(str(p['decision']))}</b>: "
            f"candidate v{p['candidate']} against baseline {base}; current policy after the "
            f"decision: v{p['current']}. Thresholds: "
            f"{html.escape(thr)}.</p><table><tr><th>rule</th><th></th><th>why</th></tr>{rows}</table>")


def _table(summary: dict[str, Any]) -> str:
    keys = ["success", "ci95", "episodes", "pass_at_k", "search_rate", "tool_calls_mean",
            "tokens_mean",
            "invalid_rate", "truncation_rate", "verifier_disagreements", "policy_version",
            *SAFETY_COST_KEYS]
    cols = [(split, t) for split in ("validation", "holdout") for t in ("sft", "final")
            if t in summary.get(split, {})]
    head = "".join(f"<th>{split} {t}</th>" for split, t in cols)
    body = ""
    for k in keys:
        cells = ""
        for split, t in cols:
            v = summary[split][t].get(k)
            text = (f"[{v[0]:.3f}, {v[1]:.3f}]" if isinstance(v, list) else f"{v:.3f}"
                    if isinstance(v, float)
                    else "-" if v is None else str(v))
            cells += f"<td>{html.escape(text)}</td>"
        body += f"<tr><th>{k}</th>{cells}</tr>"
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def alarms_section(summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The "Health alarms" section: each alarm that fired, at which updates, and why
    (`taurl.monitor.alarms`, re-checked over the run's rows with the run's thresholds)."""
    from taurl.monitor.alarms import ALARMS, alarm_config, low_precision, rl_rows, scan

    run = summary.get("config", {})
    cfg, _ = alarm_config(run.get("alarms", {}))
    cfg = dataclasses.replace(cfg, low_precision=low_precision(
        run.get("precision", "fp32"), run.get("torch_dtype", "float32")))
    updates = len(rl_rows(rows))
    head = "<h2>Health alarms</h2>"
    if not cfg.active():
        return head + "<p>Alarms were off for this run (alarms: enabled false).</p>"
    fired: dict[str, list] = {}
    for a in scan(rows, cfg):
        fired.setdefault(a.name, []).append(a)
    stopped = summary.get("train", {}).get("stopped_early")
    by = [n for n in cfg.stop_on if n in fired and any(a.update == stopped for a in fired[n])]
    text = (f"<p class='alarms-quiet'>All quiet: {len(cfg.active())} alarms checked over {updates} "
            f"RL updates, none fired.</p>" if not fired else
            f"<p class='alarms-fired'><b>{len(fired)} alarm(s) fired</b> over {updates} RL updates"
            + (f"; RL was stopped after update {stopped} by {', '.join(by)} (alarms.stop_on)" if by
               else "")
            + ".</p>")
    body = "".join(
        f"<tr><th>{html.escape(name)}</th>"
        f"<td>{html.escape(', '.join(str(a.update) for a in got))}</td>"
        f"<td style='text-align:left'>{html.escape(got[0].message)}</td>"
        f"<td style='text-align:left'>{html.escape(ALARMS[name])}</td></tr>"
        for name, got in fired.items())
    table = ("<table id='alarms'><tr><th>alarm</th><th>updates</th><th>first "
             f"firing</th><th>meaning</th></tr>{body}</table>") if fired else ""
    return head + text + table


def render_report(summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The HTML text of the report (self-contained)."""
    parts = [f"<h1>taurl run {html.escape(str(summary.get('run', '')))}</h1>"]
    h = summary.get("holdout", {})
    if "sft" in h and "final" in h:
        parts.append(f"<p><b>Holdout success</b>: SFT {h['sft']['success']:.3f} → after RL "
                     f"{h['final']['success']:.3f} (gain {h.get('gain', 0):+.3f}; 95% intervals "
                     f"{'overlap' if h.get('intervals_overlap') else 'do not overlap'}). "
                     f"Train updates: {summary.get('train', {}).get('updates')}, wall time "
                     f"{summary.get('wall_seconds', 0):.0f} s.</p>")
    parts.append(_table(summary))
    parts.append(promotion_section(summary))
    fig = holdout_figure(summary)
    if fig:
        parts.append(f'<h2>Holdout</h2><img alt="holdout" src="data:image/png;base64,{fig}">')
    parts.append(alarms_section(summary, rows))
    parts.append("<h2>Training curves</h2>")
    for title, png in curve_figures(rows):
        parts.append(f'<figure><figcaption>{html.escape(title)}</figcaption>'
                     f'<img alt="{html.escape(title)}" src="data:image/png;base64,{png}"></figure>')
    rows_html = "".join(f"<tr><th>{html.escape(k)}</th><td "
                        f"style='text-align:left'>{html.escape(v)}</td></tr>"
                        for k, v in TRAIN_GLOSSARY.items())
    parts.append(f"<h2>Glossary</h2><table>{rows_html}</table>")
    parts.append("<h2>Summary</h2><pre>" + html.escape(json.dumps(summary, indent=2)) + "</pre>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
             "text-align:right}figure{display:inline-block;margin:4px}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>taurl "
            f"report</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")


def write_report(run: RunDir | str | Path, summary: dict[str, Any],
                 rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``report.html`` into the run directory; returns its path."""
    run = run if isinstance(run, RunDir) else RunDir(Path(run))
    run.report.write_text(render_report(summary, rows), encoding="utf-8")
    return run.report
