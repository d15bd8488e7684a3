// Which of the server's lines a node's info panel shows: no DOM, no app; the browser test imports it.
// The words are the server's (nodes/reporting/panel_text.py, sent as /sage/status `panel`, a run summary's
// `lines` and `alerts`): nothing here composes user-facing text, so the panel and the server log never drift.

export const SETTINGS_NODE = "SageTritonSettings";
export const PATCH_NODE = "SageTritonPatchModelAttention";

// The panel's one line before the server has answered, or when it could not: no server lines to draw.
export const LOADING_LINE = "SageTriton · loading…";
export const UNAVAILABLE_LINE = "SageTriton · status unavailable";

// {option: {value: {why, short}}} for every choice this GPU cannot run (/sage/status `supported_choices`).
export function unsupportedChoices(status) {
  const out = {};
  for (const [option, values] of Object.entries(status?.supported_choices ?? {})) {
    for (const [value, entry] of Object.entries(values ?? {})) {
      if (entry?.ok !== false) continue;
      (out[option] ??= {})[value] = { why: String(entry.why ?? ""), short: String(entry.short ?? entry.why ?? "") };
    }
  }
  return out;
}

// Sage Settings' backend choices that cannot run here (/sage/status `backends`), in unsupportedChoices' shape
// for the widget's mark.
export function unavailableBackends(status) {
  const bad = Object.entries(status?.backends ?? {}).filter(([, b]) => b?.ok === false);
  return bad.length ? { backend: Object.fromEntries(bad.map(([name, b]) => [name, { why: b.why, short: b.short }])) } : {};
}

// Widget labels have little room: "fp8 → fp16 on this GPU" becomes "⚠ → fp16".
export function labelMark(short) {
  const to = /→\s*(\S+)/.exec(short);
  return to ? `⚠ → ${to[1]}` : "⚠";
}

export function setupInProgress(status) {
  return ["waiting", "running"].includes(status?.setup?.phase);
}

// The lines the info panel shows on a node of `nodeType`, as the server sent them: the status panel's lines,
// then a Sage Settings node's marks (and its selected `backend`'s, when that cannot run here), or a Patch
// node's own last `run` (null until that node has run: never another node's or another workflow's).
export function infoLines(nodeType, status, run = null, backend = null) {
  if (status === undefined) return [LOADING_LINE];
  if (!status?.panel) return [UNAVAILABLE_LINE];
  const panel = status.panel;
  const lines = [...(panel.lines ?? [])];
  if (nodeType === SETTINGS_NODE) {
    lines.push(...(panel.settings ?? []));
    if (backend !== null && panel.backend?.[backend]) lines.push(panel.backend[backend]);
  } else if (nodeType === PATCH_NODE) {
    lines.push(...(run?.lines ?? panel.not_run ?? []));
  }
  return lines;
}
