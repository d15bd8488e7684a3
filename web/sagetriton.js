// SageTriton's canvas extension: what the pack decided for this GPU, on the nodes themselves.
// Only the extension API is used: registerExtension hooks, declared settings, api events.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import {
  PATCH_NODE,
  SETTINGS_NODE,
  infoLines,
  labelMark,
  setupInProgress,
  unavailableBackends,
  unsupportedChoices,
} from "./sage_format.mjs";

const EXT = "SageTriton.NodeInfo";
const SHOW_SETTING = "SageTriton.NodeInfo.Show";
const INFO_WIDGET = "sagetriton_info";
const LINE_H = 16;
const PAD = 6;
const MAX_GROW_W = 360; // longer lines are cut with an ellipsis rather than widening the node further
const REPO = "https://github.com/sagetriton/ComfyUI-SageTriton";
const SETUP_POLL_MS = 5000; // while the first-start self-test runs, its progress is polled

let status; // last /sage/status answer: undefined until the first answer, null if it failed
let showInfo = null; // the setting's value as last reported by onChange (null: ask the store)
const warnedReasons = new Set(); // fallback reasons already toasted this session
const inputTooltips = new Map(); // Sage Settings input name -> the server's tooltip
const ranPatchNodes = new Set(); // Patch nodes whose run summary arrived since the last status fetch

function isOurs(node) {
  const t = node?.comfyClass ?? node?.type;
  return t === PATCH_NODE || t === SETTINGS_NODE;
}

function settingValue(id, fallback) {
  // extensionManager.setting is the current API; ui.settings is kept for older frontends.
  const v = app.extensionManager?.setting?.get?.(id) ?? app.ui?.settings?.getSettingValue?.(id);
  return v === undefined || v === null ? fallback : v;
}

function toast(severity, summary, detail) {
  app.extensionManager?.toast?.add?.({ severity, summary, detail, life: 8000 });
}

let pollTimer = null;

async function fetchStatus() {
  try {
    const res = await api.fetchApi("/sage/status", { cache: "no-store" });
    status = res.ok ? await res.json() : null;
  } catch (err) {
    console.warn("[SageTriton] no answer from /sage/status:", err);
    status = null;
  }
  // Show the first-start build's progress until it ends, then stop asking.
  clearTimeout(pollTimer);
  if (setupInProgress(status)) pollTimer = setTimeout(() => fetchStatus().then(refreshAll), SETUP_POLL_MS);
  return status;
}

// A read-only panel drawn under the node's widgets; serialize:false keeps it out of
// widgets_values and out of the prompt.
function infoWidget(node) {
  let w = node.widgets?.find((x) => x.name === INFO_WIDGET);
  if (w) return w;
  w = {
    type: "sagetriton_info",
    name: INFO_WIDGET,
    value: "",
    lines: [],
    serialize: false,
    options: { serialize: false },
    computeSize(width) {
      return [width, this.lines.length * LINE_H + PAD * 2];
    },
    draw(ctx, _node, width, y) {
      if (!this.lines.length) return;
      const h = this.lines.length * LINE_H + PAD;
      ctx.save();
      ctx.fillStyle = "rgba(20, 60, 45, 0.85)";
      ctx.beginPath();
      ctx.roundRect(10, y + 2, width - 20, h, 6);
      ctx.fill();
      ctx.font = "12px sans-serif";
      ctx.textBaseline = "middle";
      this.lines.forEach((line, i) => {
        ctx.fillStyle = i === 0 ? "#8fe3b4" : line.startsWith("⚠") ? "#f3c26b" : "#d8e4dc";
        ctx.fillText(fitText(ctx, line, width - 36), 18, y + 2 + PAD / 2 + LINE_H * i + LINE_H / 2);
      });
      ctx.restore();
    },
  };
  return node.addCustomWidget(w) ?? w;
}

function fitText(ctx, text, maxWidth) {
  if (ctx.measureText(text).width <= maxWidth) return text;
  let s = text;
  while (s.length > 1 && ctx.measureText(s + "…").width > maxWidth) s = s.slice(0, -1);
  return s + "…";
}

// Mark Sage Settings choices this GPU cannot run: the reason goes into the widget's tooltip, and
// the label says so while such a value is selected (combo values themselves must stay untouched:
// they are what the server validates).
function markChoices(node, unsupported) {
  for (const w of node.widgets ?? []) {
    if (!("sageOwnTooltip" in w)) {
      w.sageOwnTooltip = w.tooltip; // usually undefined: the frontend then shows the input's tooltip
      w.sageOwnLabel = w.label;
    }
    const bad = unsupported[w.name];
    if (!bad) {
      w.tooltip = w.sageOwnTooltip;
      w.label = w.sageOwnLabel;
      continue;
    }
    const notes = Object.entries(bad).map(([value, r]) => `${value}: ${r.why || r.short}`);
    const base = w.sageOwnTooltip ?? inputTooltips.get(w.name) ?? "";
    w.tooltip = [base, status?.panel?.choices_title, ...notes].filter(Boolean).join("\n");
    w.label = bad[w.value] ? `${w.sageOwnLabel ?? w.name} ${labelMark(bad[w.value].short)}` : w.sageOwnLabel;
    if (!w.sageWatched) {
      // Re-mark when the user picks another value.
      const prev = w.callback;
      w.callback = function (...args) {
        const r = prev?.apply(this, args);
        refreshNode(node);
        return r;
      };
      w.sageWatched = true;
    }
  }
}

function refreshNode(node) {
  if (!isOurs(node)) return;
  const type = node.comfyClass ?? node.type;
  const show = (showInfo ?? settingValue(SHOW_SETTING, true)) !== false;
  const w = infoWidget(node);
  const unsupported = unsupportedChoices(status);
  const backend = node.widgets?.find((x) => x.name === "backend")?.value ?? null;
  w.lines = show ? infoLines(type, status, node.sageRun ?? null, backend) : [];
  w.value = w.lines.join("\n");
  w.hidden = !show;
  if (type === SETTINGS_NODE) markChoices(node, show ? { ...unsupported, ...unavailableBackends(status) } : {});
  // Grow (never shrink) the node so the panel's lines fit; 12px sans-serif is ~6.6px a character.
  const min = node.computeSize();
  const textWidth = Math.min(MAX_GROW_W, Math.max(0, ...w.lines.map((l) => l.length * 6.6 + 40)));
  node.setSize([Math.max(node.size[0], min[0], textWidth), Math.max(node.size[1], min[1])]);
  node.setDirtyCanvas?.(true, true);
}

function refreshAll() {
  for (const node of app.graph?.nodes ?? []) refreshNode(node);
  app.graph?.setDirtyCanvas?.(true, true);
}

let refreshTimer = null;
let promptEnded = false; // a prompt finished: every Patch node's run is on the server by now
let afterRunChain = Promise.resolve(); // one afterRun at a time, in order
function refreshAtPromptEnd() {
  promptEnded = true;
  refreshSoon();
}
function refreshSoon() {
  // Several events arrive per prompt (run events, success): one status fetch for all of them.
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => {
    afterRunChain = afterRunChain.then(afterRun, afterRun);
  }, 150);
}

async function afterRun() {
  // Taken before the fetch: a prompt that ends while it is in flight gets a fetch of its own, so a
  // status read before the last run was recorded never forgets the nodes still waiting for it.
  const ended = promptEnded;
  promptEnded = false;
  const waiting = [...ranPatchNodes];
  const fresh = await fetchStatus();
  // A node shows its own run: the one the server recorded under its id, once its summary came to
  // this tab (the run event goes only to the tab that queued the prompt).
  for (const node of waiting) node.sageRun = fresh?.runs_by_node?.[String(node.id)] ?? node.sageRun;
  // A run event can come before the server has recorded that run: keep the nodes until the prompt ends.
  if (ended) for (const node of waiting) ranPatchNodes.delete(node);
  refreshAll();
  // What the server says a run is worth a toast for (downgraded settings, kernel failures), once a session.
  for (const alert of fresh?.last_run?.alerts ?? []) {
    if (warnedReasons.has(alert.key)) continue;
    warnedReasons.add(alert.key);
    toast(alert.severity, alert.summary, alert.detail);
  }
}

app.registerExtension({
  name: EXT,
  settings: [
    {
      id: SHOW_SETTING,
      category: ["SageTriton", "Nodes", "Show info"],
      name: "Show GPU, defaults and last-run info on SageTriton nodes",
      tooltip: "The panel on Patch Model Attention and Sage Settings nodes, from GET /sage/status.",
      type: "boolean",
      defaultValue: true,
      // onChange runs before the store holds the new value: use the value it is given.
      onChange: (value) => {
        showInfo = value;
        refreshAll();
      },
    },
  ],
  aboutPageBadges: [{ label: "SageTriton", url: REPO, icon: "pi pi-github" }],
  async setup() {
    await fetchStatus();
    refreshAll();
    api.addEventListener("execution_success", refreshAtPromptEnd);
    api.addEventListener("execution_error", refreshAtPromptEnd);
    // The first-start self-test's progress (nodes/reporting/status_route.py SETUP_EVENT); unlistened, the
    // frontend logs every such message as "Unhandled message".
    api.addEventListener("sagetriton.setup", refreshSoon);
    // A Patch node ran (nodes/reporting/run_summary.py RUN_EVENT, sent to the tab that queued the prompt).
    api.addEventListener("sagetriton.run", ({ detail }) => {
      const node = app.graph?.getNodeById?.(detail?.node);
      if ((node?.comfyClass ?? node?.type) !== PATCH_NODE) return;
      if (Array.isArray(detail.lines)) {
        node.sageRun = { lines: detail.lines }; // shown at once, as sent
        refreshNode(node);
      }
      ranPatchNodes.add(node);
      refreshSoon();
    });
  },
  beforeRegisterNodeDef(_nodeType, nodeData) {
    // Keep the inputs' own tooltips: a marked widget shows them above the GPU note.
    if (nodeData?.name !== SETTINGS_NODE) return;
    for (const section of ["required", "optional"]) {
      for (const [name, spec] of Object.entries(nodeData.input?.[section] ?? {})) {
        if (spec?.[1]?.tooltip) inputTooltips.set(name, spec[1].tooltip);
      }
    }
  },
  nodeCreated(node) {
    if (isOurs(node)) refreshNode(node);
  },
  loadedGraphNode(node) {
    // Saved widget values are applied after nodeCreated: re-mark the selected choices.
    if (isOurs(node)) refreshNode(node);
  },
});
