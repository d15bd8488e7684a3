// Pure text helpers for the SageTriton extension: no DOM, no app; the browser test imports them.

export const SETTINGS_NODE = "SageTritonSettings";
export const PATCH_NODE = "SageTritonPatchModelAttention";

// One choice of /sage/status `choices` -> {ok, why}. The server serialises kernels/arch.py's
// supported_choices(), whose entries are (ok, reason) tuples; {ok, reason} objects are accepted too.
export function choiceState(entry) {
  if (Array.isArray(entry)) return { ok: entry[0] !== false, why: String(entry[1] ?? "") };
  if (entry && typeof entry === "object") {
    const ok = entry.ok ?? entry.supported ?? true;
    return { ok: ok !== false, why: String(entry.reason ?? entry.why ?? "") };
  }
  return { ok: entry !== false, why: "" };
}

// The short, visible part of a reason: "sm80 has no fp8 ...; fp8 → fp16 on this GPU" -> "fp8 → fp16 on this GPU".
export function shortReason(value, why) {
  const arrow = String(why).split(";").map((s) => s.trim()).find((s) => s.includes("→"));
  return arrow || (value ? `${value} not supported on this GPU` : String(why));
}

// The resolved defaults; the route may key them by head_dim ({"64": ..., "128": ...}): most
// models attend with 128-wide heads.
export function resolvedDefaults(status) {
  const d = status?.defaults;
  if (!d || typeof d !== "object") return null;
  if ("qk_quant_gran" in d) return d;
  return d["128"] ?? Object.values(d)[0] ?? null;
}

// {option: {value: {why, short}}} for every choice this GPU cannot run (`choices` or `supported_choices`).
export function unsupportedChoices(status) {
  const out = {};
  for (const [option, values] of Object.entries(status?.choices ?? status?.supported_choices ?? {})) {
    for (const [value, entry] of Object.entries(values ?? {})) {
      const { ok, why } = choiceState(entry);
      if (ok) continue;
      (out[option] ??= {})[value] = { why, short: shortReason(value, why) };
    }
  }
  return out;
}

// Sage Settings' backend choices that cannot run here (/sage/status `backends`), in unsupportedChoices' shape
// for the widget's mark: {backend: {SageAttention: {why, short: "SageAttention unavailable here → SageTriton"}}}.
export function unavailableBackends(status) {
  const bad = Object.entries(status?.backends ?? {}).filter(([, b]) => b?.ok === false);
  return bad.length ? { backend: Object.fromEntries(bad.map(([name, b]) => [name, { why: b.why, short: b.short }])) } : {};
}

// The panel line for the backend a Sage Settings node has selected, when it cannot run here; else null.
export function backendLine(status, backend) {
  const b = unavailableBackends(status).backend?.[backend];
  return b ? `⚠ ${b.short}` : null;
}

export function archLabel(status) {
  if (status === undefined) return "SageTriton · loading…";
  if (!status) return "SageTriton · status unavailable";
  const parts = ["SageTriton", status.arch ?? "?"];
  const family = status.family ?? status.defaults?.family;
  if (family && family !== status.arch) parts.push(family);
  if (status.vendor && status.vendor !== "cpu") parts.push(status.vendor.toUpperCase());
  return parts.join(" · ");
}

// "kernel from 4096 tokens": shorter keys go to the fallback (quantization overhead wins there).
export const NO_KERNEL_LINE = "no GPU: ComfyUI's own attention runs";

export function seqLine(status) {
  // No GPU (or ComfyUI started with --cpu): the patch changes nothing, whatever the defaults say.
  if (status?.kernel_active === false) return NO_KERNEL_LINE;
  // min_seq_len -1 means the crossover measured on this GPU; the table default until measured.
  let n = status?.crossover;
  if (n && typeof n === "object") n = n.seq_len ?? n["128"];
  if (typeof n !== "number") n = resolvedDefaults(status)?.min_seq_len;
  if (n === undefined || n === null) return null;
  return Number(n) <= 0 ? "kernel at any sequence length" : `kernel from ${n} tokens`;
}

// Short lines keep the nodes narrow: "defaults: QK per_warp · PV fp8 · fp32 acc".
export function defaultsLine(status) {
  const d = resolvedDefaults(status);
  if (!d) return "defaults: not reported yet";
  const parts = [`QK ${d.qk_quant_gran ?? "?"}`, `PV ${d.pv_precision ?? "?"}`];
  if (d.pv_accum_dtype) parts.push(`${d.pv_accum_dtype} acc`);
  return `defaults: ${parts.join(" · ")}`;
}

export function fallbackLine(replaced, fallbackBackend) {
  return fallbackBackend && fallbackBackend !== replaced
    ? `took over from ${replaced} · fallbacks on ${fallbackBackend}` : `fallbacks run on ${replaced}`;
}

// ["last run: 120 kernel · 8 fallback", "6× key length < 4096", "2× mask kind", ...]: the top
// `top` fallback reasons one a line (they are sentences), then any downgrade notes.
export function runLines(run, top = 3) {
  if (!run) return ["last run: none yet"];
  const fb = Object.entries(run.fallback ?? {}).sort((a, b) => b[1] - a[1]);
  const nfb = fb.reduce((s, [, n]) => s + Number(n), 0);
  const lines = [`last run: ${run.kernel ?? 0} kernel · ${nfb} fallback`];
  if (run.backend && run.backend !== "SageTriton") lines.push(`kernel calls on ${run.backend} (Sage Settings)`);
  if (run.rope) lines.push(`RoPE: ${run.rope} calls on SageTriton's kernel`);
  else if (run.rope_off) lines.push("RoPE: ComfyUI's, compiled by torch.compile");
  lines.push(...sparseLines(run.sparse));
  const outer = outerLine(run.outer);
  if (outer) lines.push(outer);
  // What runs the fallbacks, and the attention this patch took over from when that is another one
  // (nodes/core_backends.py); the same words as the run summary (nodes/reporting/run_summary.py).
  if (run.replaced) lines.push(fallbackLine(run.replaced, run.fallback_backend));
  for (const [why, n] of fb.slice(0, top)) lines.push(`${n}× ${why}`);
  if (fb.length > top) lines.push(`+${fb.length - top} more fallback reasons`);
  for (const note of run.notes ?? []) lines.push(`⚠ ${shortReason("", note)}`);
  return lines;
}

// Sparse attention's part of a run (nodes/reporting/sparse_summary.py): its calls and density, then the
// calls it left dense by reason, on one line; notes (a kernel failure) as warnings.
export function sparseLines(sparse, top = 3) {
  if (!sparse) return [];
  if (sparse.off) return [`⚠ ${sparse.off}`];
  const density = typeof sparse.density === "number" ? ` · ${(sparse.density * 100).toFixed(1)} % blocks exact` : "";
  const lines = [`sparse ${sparse.mode}: ${sparse.calls ?? 0} calls${density}`];
  const dense = Object.entries(sparse.dense ?? {}).sort((a, b) => b[1] - a[1]);
  if (dense.length) {
    const shown = dense.slice(0, top).map(([why, n]) => `${n}× ${why}`).join(" · ");
    lines.push(`left dense: ${shown}${dense.length > top ? ` · +${dense.length - top} more` : ""}`);
  }
  for (const note of sparse.notes ?? []) lines.push(`⚠ ${note}`);
  return lines;
}

// Another node's attention override on top of this patch's (nodes/routing/override_watch.py, the run
// summary's `outer`): who ran the calls; a warning when this patch's override ran none.
export function outerLine(outer) {
  if (!outer) return null;
  const calls = outer.calls ?? "?";
  if (outer.ours_unused) {
    return outer.label === "core's Model Sparse Attention"
      ? `${outer.label} ran all ${calls} calls` : `⚠ not running: ${outer.label} replaced it`;
  }
  return `${outer.label}: ${outer.ran_itself ?? "?"} calls · ${outer.reached} to SageTriton`;
}

// The one-time build + self-test that runs in the background on a first start (status.setup):
// a line while it runs or if it failed; nothing while it waits (it may find nothing to do),
// once it is done, or when it is skipped (no GPU).
export function setupLine(status) {
  const setup = status?.setup;
  if (setup?.phase === "failed") return `⚠ self-test failed: ${setup.message || "see the server log"}`;
  if (setup?.phase !== "running") return null;
  const { done, total } = setup.progress ?? {};
  return total ? `⏳ building and testing kernels ${done ?? 0}/${total}` : "⏳ building and testing kernels";
}

// A report the pack ignored as invalid (tampered, half-written): table defaults until it is redone.
export function reportLine(status) {
  const why = status?.report?.invalid;
  return why ? `⚠ self-test report ignored (${why}); table defaults until it is redone` : null;
}

export function setupInProgress(status) {
  return ["waiting", "running"].includes(status?.setup?.phase);
}

// The lines the info panel shows on a node of `nodeType`; `run` is a Patch node's own last run
// (null until that node has run: never another node's or another workflow's); `backend` a Sage Settings
// node's selected backend.
export function infoLines(nodeType, status, unsupported = unsupportedChoices(status), run = null, backend = null) {
  const lines = [archLabel(status)];
  if (!status) return lines;
  lines.push(defaultsLine(status));
  const seq = seqLine(status);
  if (seq) lines.push(seq);
  const setup = setupLine(status);
  if (setup) lines.push(setup);
  const report = reportLine(status);
  if (report) lines.push(report);
  if (nodeType === SETTINGS_NODE) {
    for (const values of Object.values(unsupported)) {
      for (const { short } of Object.values(values)) lines.push(`⚠ ${short}`);
    }
    const unavailable = backendLine(status, backend);
    if (unavailable) lines.push(unavailable);
  } else if (nodeType === PATCH_NODE) {
    lines.push(...runLines(run));
  }
  return lines;
}
