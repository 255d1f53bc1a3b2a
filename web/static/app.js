// slurm-ext cluster page: plain JavaScript, no framework, nothing fetched from elsewhere.
// It polls the server's one shared view of the cluster (/api/cluster?since=) every refresh interval, asking only for
// what changed since the version it has: each node's row without its GPUs' readings, and apart from the rows each
// node's figures (changes.FIGURES), which move at nearly every refresh. The Nodes list, which shows each GPU, asks
// for its page of whole rows, filtered and sorted by the server (/api/nodes). It draws the tab on show; operations
// POST with the page's CSRF token and the operator's token (kept in this tab's sessionStorage).
"use strict";

const STATES = ["healthy", "booting", "unhealthy", "pending", "paused"];
//: usage history points kept (the server's: an hour at a 5 s refresh)
const HISTORY_KEPT = 720;
//: rows of the Nodes list a page (/api/nodes?limit=): next and previous go through the rest
const LIST_PAGE = 100;
//: rows of the Health checks tab's check table drawn at most (choosing a node shows that node's)
const CHECKS_MAX = 500;
const byName = new Intl.Collator(undefined, {numeric: true});
const page = {
  view: null, session: null, lastGood: 0, tab: "overview",
  sort: {key: "name", desc: false}, nodeView: sessionStorage.getItem("slurm-ext-node-view") || "list", timer: null,
  // the rows by node name (without their GPUs' readings), each node's figures by name ([utilization %, memory used
  // MiB, memory total MiB, hottest C, idle GPUs]: changes.FIGURES), the version of the view held (asked back as
  // since=), and counts of the merges that changed a row (changes) or a node's figures (moved): what the grids and
  // the Nodes tab redraw on
  rows: new Map(), figures: new Map(), version: "", changes: 0, moved: 0, polls: 0, shown: null, grids: null,
  // the Nodes list: its first row (offset), the newest request's number (an older answer is dropped), the last
  // answer of /api/nodes ({total, offset, rows}) and what the last request was refused for
  list: {offset: 0, asked: 0, answer: null, error: ""},
};

// -- small helpers --------------------------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);
function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
    "'": "&#39;"}[c]));
}
// The one time format of slurm-ext (the CLI's too): ISO 8601 to the second with the zone's offset, here the
// browser's zone, so that a time read off the page can be pasted into `slurm-ext history --since` as it is.
function when(epoch) {
  if (!epoch) return "-";
  const d = new Date(epoch * 1000);
  const pad = (n) => String(Math.abs(n)).padStart(2, "0");
  const east = -d.getTimezoneOffset();  // minutes east of UTC
  const zone = `${east < 0 ? "-" : "+"}${pad(Math.trunc(east / 60))}:${pad(east % 60)}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}${zone}`;
}
function age(seconds) {
  if (seconds == null) return "never";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
function bytes(perSecond) {
  if (perSecond == null) return "-";
  const units = ["B/s", "KB/s", "MB/s", "GB/s", "TB/s"];
  let value = perSecond, unit = 0;
  while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit++; }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}
function gib(mib) { return mib == null ? "-" : `${(mib / 1024).toFixed(1)} GiB`; }
// a sparkline's axis has room for about six characters: 2246.4 GiB is 2.2 TiB there
function gibShort(mib) { return mib >= 1024 * 1000 ? `${(mib / 1024 / 1024).toFixed(1)} TiB` : `${Math.round(mib / 1024)} GiB`; }
function token() { return sessionStorage.getItem("slurm-ext-token") || ""; }
// "1 node", "2 nodes", never "1 nodes" (the CLI's slurm_ext.words.counted)
function counted(count, noun, plural = "") { return `${count} ${count === 1 ? noun : plural || noun + "s"}`; }

function say(text, error = false) {
  const box = $("message");
  box.textContent = text;
  box.className = error ? "message error" : "message";
  box.hidden = false;
}
function hint(text) {  // neither good nor bad news: what to do next
  say(text);
  $("message").className = "message hint";
}

async function getJSON(path, headers = {}) {
  const answer = await fetch(path, {cache: "no-store", headers});
  const data = await answer.json().catch(() => ({error: `${answer.status} ${answer.statusText}`}));
  if (!answer.ok) throw Object.assign(new Error(data.error || `${answer.status}`), {status: answer.status});
  return data;
}

// the session (a CSRF token), asked with the tab's operator token: the server says whose it is, or that it is not known
async function askSession() {
  page.session = await getJSON("api/session", token() ? {"Authorization": `Bearer ${token()}`} : {});
  return page.session;
}

async function post(path, body, retried = false) {
  if (!page.session) await askSession();
  const headers = {"Content-Type": "application/json", "X-CSRF-Token": page.session.csrf};
  if (token()) headers["Authorization"] = `Bearer ${token()}`;
  const answer = await fetch(path, {method: "POST", headers, body: JSON.stringify(body || {})});
  const data = await answer.json().catch(() => ({error: `${answer.status} ${answer.statusText}`}));
  if (answer.status === 403 && /CSRF/.test(data.error || "") && !retried) {  // the server restarted: a new token
    await askSession();
    return post(path, body, true);
  }
  if (answer.status === 401) await showSession(data.error || "");  // an expired sign-in: offered again
  if (!answer.ok) throw new Error(data.error || `${answer.status}`);
  return data;
}

// -- the poll --------------------------------------------------------------------------------------------------

async function poll() {
  clearTimeout(page.timer);
  const asked = ++page.polls;
  try {
    // since= empty the first time (the whole view, the page's form of it), then the version held
    const answer = await getJSON(`api/cluster?since=${encodeURIComponent(page.version)}`);
    if (asked !== page.polls) return;  // a poll asked after this one (an operation's) takes the newer answer in
    merge(answer);
    page.lastGood = Date.now() / 1000;
  } catch (err) {
    if (asked !== page.polls) return;
    if (err.status === 400) page.version = "";  // a version the server does not take: the whole view next time
    if (err.status === 401) {  // viewing needs sign-in, or the sign-in expired: the prompt says which
      await showSession(err.message);
      page.timer = setTimeout(poll, 1000 * ((page.view && page.view.refresh) || 5));
      return;
    }
    banner(`The page's server does not answer (${err.message}); shown: what it said ${age(Date.now() / 1000 - page.lastGood)} ago.`, true);
  }
  if (page.view) draw();
  page.timer = setTimeout(poll, 1000 * ((page.view && page.view.refresh) || 5));
}

// An answer of /api/cluster?since= taken in: the whole view ("full") replaces the rows and the figures held, a delta
// changes the rows and the figures it sends and drops both of each node it says "removed"; the usage history points
// it sends follow those held. page.view is the answer with every row held, sorted by name (its figures in
// page.figures).
function merge(answer) {
  const usage = answer.usage || {};
  const figures = Object.entries(answer.figures || {});
  let history, renamed = false;
  if (answer.full || !page.view) {
    page.rows = new Map((answer.nodes || []).map((n) => [n.name, n]));
    page.figures = new Map(figures);  // a Map: a node's name is never taken for an object's own key
    history = usage.history || [];
    renamed = true;
  } else {
    for (const n of answer.nodes || []) {
      renamed = renamed || !page.rows.has(n.name);
      page.rows.set(n.name, n);
    }
    for (const [name, f] of figures) page.figures.set(name, f);
    for (const name of answer.removed || []) {
      renamed = page.rows.delete(name) || renamed;
      page.figures.delete(name);
    }
    const held = (page.view.usage || {}).history || [], newest = held.length ? held[held.length - 1][0] : -Infinity;
    history = held.concat((usage.history || []).filter((p) => p[0] > newest));
  }
  if (history.length > HISTORY_KEPT) history = history.slice(-HISTORY_KEPT);
  const nodes = renamed ? [...page.rows.values()].sort((a, b) => byName.compare(a.name, b.name)) :
    page.view.nodes.map((n) => page.rows.get(n.name));
  if (answer.full || (answer.nodes || []).length || (answer.removed || []).length) page.changes++;
  if (answer.full || figures.length || (answer.removed || []).length) page.moved++;
  page.version = answer.version || "";
  page.view = {...answer, nodes, usage: {...usage, history}};
  delete page.view.removed;
  delete page.view.figures;
}

function banner(text, error) {
  const box = $("banner");
  box.hidden = !text;
  box.textContent = text || "";
  box.className = error ? "banner error" : "banner";
}

function sourcesBanner(view) {
  const problems = [];
  const names = {"slurm": "slurmctld (the node table)", "slurm-jobs": "slurmctld (the job queue)",
                 "slurm-events": "slurmdbd (the event table)",
                 "repair": "the repair database", "prometheus": "Prometheus"};
  for (const [name, source] of Object.entries(view.sources)) {
    if (!source.ok) {
      problems.push(`${names[name] || name} does not answer: ${source.error}` +
        (source.answered ? `; shown: its last answer, ${age(source.age)} old` : "; nothing known yet"));
    }
  }
  const silent = Object.keys(view.agents.not_answering || {});
  if (silent.length) {
    problems.push(`${counted(silent.length, "node agent")} not answering: ${silent.slice(0, 8).join(", ")}` +
      (silent.length > 8 ? " ..." : ""));
  }
  if (Date.now() / 1000 - page.lastGood > 3 * view.refresh) return;  // the server's own banner stands
  banner(problems.join(" | "), view.sources.slurm && !view.sources.slurm.ok);
}

function draw() {
  const view = page.view;
  const offer = view.acceptance && view.acceptance.offer;  // said until a cluster run ends after it
  $("offer").hidden = !offer;
  $("offer").textContent = offer ? `${offer} (offered ${when(view.acceptance.offered)})` : "";
  $("cluster-name").textContent = view.cluster.name || "cluster";
  document.title = `slurm-ext: ${view.cluster.name || "cluster"}`;
  sourcesBanner(view);
  $("status-line").textContent = `read ${when(view.refreshed)} (every ${view.refresh} s, shared by every open page); ` +
    `${view.agents.answering} of ${counted(view.agents.nodes, "node agent")} answering`;
  if (page.tab === "overview") drawOverview(view);
  if (page.tab === "nodes") drawNodes(view);
  if (page.tab === "health") drawHealth(view);
  if (page.tab === "repair") drawRepairs();
}

// -- overview ----------------------------------------------------------------------------------------------------

function drawOverview(view) {
  $("state-counts").innerHTML = STATES.map((s) =>
    `<div class="count ${s}" data-state="${s}"><div class="n">${esc(view.counts[s])}</div>${s}</div>`).join("");
  page.grids.state.show(view.nodes, page.changes);
  const usage = view.usage.now || {};
  const alloc = view.allocation || {};
  $("usage-allocation").textContent = alloc.gpus ?
    `${alloc.allocated} of ${counted(alloc.gpus, "GPU")} (${alloc.share.toFixed(1)} %)` : "-";
  $("allocation-detail").textContent = [
    Object.entries(alloc.by_type || {}).map(([t, n]) => `${t}: ${n.allocated} of ${n.total}`).join(", "),
    alloc.idle ? `${alloc.idle} allocated ${alloc.idle === 1 ? "GPU" : "GPUs"} idle (under ${alloc.idle_below} for ` +
      `${age(alloc.idle_after)})` : "",
    view.queue ? `${view.queue.running} ${view.queue.running === 1 ? "job" : "jobs"} running, ${view.queue.pending} ` +
      "pending" : ""].filter(Boolean).join("; ");
  $("usage-utilization").textContent = usage.gpu_utilization == null ? "-" :
    `${usage.gpu_utilization.toFixed(1)} % of ${counted(usage.gpus, "GPU")}`;
  $("usage-memory").textContent = usage.memory_total_mib ?
    `${gib(usage.memory_used_mib)} of ${gib(usage.memory_total_mib)}` : "-";
  $("usage-network").textContent = usage.rx_bps == null ? "-" : `in ${bytes(usage.rx_bps)}, out ${bytes(usage.tx_bps)}`;
  const history = view.usage.history || [];
  const percent = (v) => `${Math.round(v)} %`;
  spark("spark-allocation", history, (p) => p[6], 100, percent);
  spark("spark-utilization", history, (p) => p[1], 100, percent);
  spark("spark-memory", history, (p) => p[2], Math.max(1, ...history.map((p) => p[3] || 0)), gibShort);
  spark("spark-network", history, (p) => (p[4] || 0) + (p[5] || 0), null, bytes);
  for (const link of document.querySelectorAll(".panel .grafana")) {
    link.hidden = !view.usage.grafana;
    if (view.usage.grafana) link.href = view.usage.grafana;
  }
  const queue = view.queue || {partitions: [], users: []};
  $("partitions").tBodies[0].innerHTML = queue.partitions.map((p) =>
    `<tr data-partition="${esc(p.name)}"><td>${esc(p.name)}</td><td>${esc(p.running)}</td><td>${esc(p.pending)}</td>` +
    `<td>${esc(p.gpus)}</td></tr>`).join("") || `<tr><td colspan="4" class="muted">no job in Slurm's queue</td></tr>`;
  $("users").tBodies[0].innerHTML = queue.users.slice(0, 20).map((u) =>
    `<tr data-user="${esc(u.user)}"><td>${esc(u.user)}</td><td>${esc(u.running)}</td><td>${esc(u.pending)}</td>` +
    `<td>${esc(u.gpus)}</td></tr>`).join("") || `<tr><td colspan="4" class="muted">no job in Slurm's queue</td></tr>`;
  drawConfig(view.cluster, view.acceptance);
  nodeChoices($("timeline-node"), view);
  drawTimeline();
}

function nodeChoices(select, view) {
  const chosen = select.value, names = view.nodes.map((n) => n.name);
  if (select.options.length - 1 !== names.length) {
    select.innerHTML = `<option value="">all</option>` + names.map((n) => `<option>${esc(n)}</option>`).join("");
    select.value = chosen;
  }
}

function drawTimeline() {
  const query = new URLSearchParams({limit: "60"});
  for (const [key, id] of [["node", "timeline-node"], ["source", "timeline-source"], ["severity", "timeline-severity"],
    ["event", "timeline-event"]]) {
    const value = $(id).value.trim();
    if (value) query.set(key, value);
  }
  getJSON(`api/timeline?${query}`).then((data) => {
    $("timeline").tBodies[0].innerHTML = data.entries.map((e) =>
      `<tr data-source="${esc(e.source)}" data-severity="${esc(e.severity)}"><td class="time">${when(e.time)}</td><td>${esc(e.node)}</td><td>${esc(e.source)}</td>` +
      `<td>${esc(e.event)}</td><td>${esc(e.message)}${e.user ? ` <span class="muted">[${esc(e.user)}]</span>` : ""}` +
      `${(e.lines || []).length ? `<ul class="lines">${e.lines.map((l) => `<li>${esc(l)}</li>`).join("")}</ul>` : ""}</td></tr>`).join("") ||
      `<tr><td colspan="5" class="muted">no event matches in the timeline window</td></tr>`;
  }).catch((err) => say(`timeline: ${err.message}`, true));
}

// A sparkline with its axes: the top and bottom of its scale in its unit on the left, its time span below.
function spark(id, history, valueOf, top, format) {
  const points = history.filter((p) => valueOf(p) != null);
  const box = $(id);
  if (points.length < 2) {
    box.innerHTML = `<text x="36" y="30" class="axis">collecting (one point per refresh)</text>`;
    return;
  }
  const high = top || Math.max(1, ...points.map(valueOf));
  const first = points[0][0], span = Math.max(1, points[points.length - 1][0] - first);
  const x = (t) => 36 + 200 * (t - first) / span, y = (v) => 44 - 40 * Math.min(v / high, 1);
  const coords = points.map((p) => `${x(p[0]).toFixed(1)},${y(valueOf(p)).toFixed(1)}`);
  box.innerHTML = `<line class="axis" x1="35" y1="4" x2="35" y2="44"></line><line class="axis" x1="35" y1="44" x2="238" y2="44"></line>` +
    `<text class="axis" x="33" y="9" text-anchor="end">${esc(format(high))}</text>` +
    `<text class="axis" x="33" y="44" text-anchor="end">${esc(format(0))}</text>` +
    `<text class="axis span" x="36" y="55">${esc(age(span))} ago</text><text class="axis" x="238" y="55" text-anchor="end">now</text>` +
    `<polyline points="${coords.join(" ")}"></polyline>`;
}

// whether acceptance is on for the cluster: its levels when on, the setting's own words (what it is off for, when to
// turn it on) when off
function acceptanceWords(a) {
  if (!a) return "-";
  return a.enabled ? `on: at start ${a.at_start}, after a repair ${a.after_repair}, after a reset or reprovision ` +
    `${a.after_reset}` : a.why_off;
}

function drawConfig(c, accepting) {
  const rows = [
    ["acceptance tests", acceptanceWords(accepting)],
    ["cluster", c.name], ["controller", c.controller], ["Slurm", c.slurm_version],
    ["slurmd versions", c.slurmd_versions.join(", ")], ["nodes", c.nodes],
    ["GPUs by type", Object.entries(c.gpus_by_type).map(([t, n]) => `${n} ${t}`).join(", ") || "none"],
    ["NVIDIA driver", Object.entries(c.drivers).map(([v, n]) => `${v} (${counted(n, "node")})`).join(", ") || "-"],
    ["OS image", Object.entries(c.os_images).map(([v, n]) => `${v} (${counted(n, "node")})`).join(", ") || "-"],
    ["kernel", c.kernels.join(", ") || "-"],
    ["network interfaces", Object.entries(c.interfaces).map(([name, i]) =>
      `${name} (${counted(i.nodes, "node")}${i.speeds_mbps.length ? ", " + i.speeds_mbps.map((s) => s / 1000 + " Gb/s").join("/") : ""})`).join(", ") || "-"],
    ...Object.entries(c.fields),
  ];
  $("config").tBodies[0].innerHTML = rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join("");
}

// -- the node grids ------------------------------------------------------------------------------------------------
// The Overview's state grid and the Nodes tab's grid view are each one <canvas>, not an element per node: one cell
// per node, coloured by its state as the stylesheet colours states (--healthy, ...), the Nodes grid's with the node's
// name and GPU use written in it (its figures: page.figures); a tooltip names the node under the pointer, its state,
// reason and what it holds.
// A grid taller than the window draws the cells in view only, and those again as the window scrolls; otherwise it is
// drawn again only when its rows or its size changed. Its canvas says what it holds (data-nodes: the cells laid out,
// data-drawn: those drawn last, in view), and slurmExt.cellAt(name, grid) where a node's cell is.

const GRID_FONT = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
const stateColours = {};
function stateColour(state) {
  if (!(state in stateColours)) {
    stateColours[state] = getComputedStyle(document.documentElement).getPropertyValue(`--${state}`).trim() || "#8a8f98";
  }
  return stateColours[state];
}
// what a cell of the Nodes grid says: its name, then its GPUs in use and their utilization
function cellLines(n) {
  const f = nodeFigures(n);
  return [n.name, `${n.gpus_used}/${counted(n.gpus_total, "GPU")}` +
    `${f.utilization == null ? "" : " " + f.utilization.toFixed(0) + "%"}`];
}
function cellTip(n) {
  return `${n.name}: ${n.state}${n.reason ? " - " + n.reason : ""}` +
    `${(n.held || []).length ? "; held: " + n.held.join("; ") : ""}`;
}
// `text` cut to `room` pixels with an ellipsis, as the stylesheet's text-overflow cut it
function fitted(context, text, room) {
  if (context.measureText(text).width <= room) return text;
  let low = 0, high = text.length;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (context.measureText(text.slice(0, middle) + "\u2026").width <= room) low = middle; else high = middle - 1;
  }
  return text.slice(0, low) + "\u2026";
}

class Grid {
  // box: the grid's element, its <canvas> inside; big: the Nodes grid's cells (92 px, with text), else small ones that
  // fit the cluster in about 480 px of height; pick(row): what a click on a cell does
  constructor(box, big, pick) {
    Object.assign(this, {box, big, pick, canvas: box.querySelector("canvas"), rows: [], key: null, width: 0,
      top: 0, tall: 0, ratio: 0, cell: {w: 0, h: 0, gap: 0, cols: 1, height: 0}});
    new ResizeObserver(() => { if (this.box.clientWidth !== this.width) this.layout(); }).observe(box);
    this.canvas.addEventListener("mousemove", (event) => this.hover(event));
    this.canvas.addEventListener("mouseleave", () => { $("grid-tip").hidden = true; });
    this.canvas.addEventListener("click", (event) => {
      const row = this.rowAt(event.clientX, event.clientY);
      if (row && this.pick) this.pick(row);
    });
  }

  // these rows, drawn again only when `key` (what they were made of) changed
  show(rows, key) {
    if (key === this.key && rows.length === this.rows.length) return;
    this.rows = rows;
    this.key = key;
    this.layout();
  }

  layout() {
    this.width = this.box.clientWidth;
    if (!this.width) return;  // hidden: laid out when shown (the observer)
    let w = 92, h = 40, gap = 4;
    if (!this.big) {
      const step = Math.max(4, Math.min(18, Math.floor(Math.sqrt(this.width * 480 / Math.max(1, this.rows.length)))));
      gap = step >= 12 ? 4 : step >= 7 ? 2 : 1;
      w = h = step - gap;
    }
    const cols = Math.max(1, Math.floor((this.width + gap) / (w + gap)));
    const height = Math.max(0, Math.ceil(this.rows.length / cols) * (h + gap) - gap);
    this.cell = {w, h, gap, cols, height};
    this.box.style.height = `${height}px`;
    this.paint(true);
  }

  // the cells in view drawn (all of them where the grid fits in the window); `again`: even where the same part is
  paint(again = false) {
    const {w, h, gap, cols, height} = this.cell;
    if (!this.width || this.box.hidden) return;
    const tall = Math.min(height, window.innerHeight);
    const top = Math.max(0, Math.min(height - tall, Math.floor(-this.box.getBoundingClientRect().top)));
    const ratio = window.devicePixelRatio || 1;
    if (!again && top === this.top && tall === this.tall && ratio === this.ratio) return;
    Object.assign(this, {top, tall, ratio});
    const canvas = this.canvas;
    Object.assign(canvas.style, {top: `${top}px`, width: `${this.width}px`, height: `${tall}px`});
    canvas.width = Math.round(this.width * ratio);  // sizing clears it
    canvas.height = Math.round(tall * ratio);
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.font = GRID_FONT;
    context.textBaseline = "top";
    const first = Math.floor(top / (h + gap)) * cols;
    const last = Math.min(this.rows.length, Math.ceil((top + tall) / (h + gap)) * cols);
    const radius = Math.min(5, w / 4);
    for (let i = first; i < last; i++) {
      const n = this.rows[i], x = (i % cols) * (w + gap), y = Math.floor(i / cols) * (h + gap) - top;
      context.fillStyle = stateColour(n.state);
      context.beginPath();
      if (context.roundRect) context.roundRect(x, y, w, h, radius); else context.rect(x, y, w, h);
      context.fill();
      if (this.big) {
        context.fillStyle = "#fff";
        cellLines(n).forEach((line, k) => context.fillText(fitted(context, line, w - 12), x + 6, y + 5 + 16 * k));
      }
    }
    canvas.dataset.nodes = this.rows.length;
    canvas.dataset.drawn = Math.max(0, last - first);
    canvas.setAttribute("aria-label", `${counted(this.rows.length, "node")} by state`);
  }

  // the row whose cell is at these viewport coordinates, or null (a gap, past the last)
  rowAt(clientX, clientY) {
    const {w, h, gap, cols} = this.cell, box = this.box.getBoundingClientRect();
    const x = clientX - box.left, y = clientY - box.top;
    const col = Math.floor(x / (w + gap)), line = Math.floor(y / (h + gap));
    if (x < 0 || y < 0 || col >= cols || x - col * (w + gap) >= w || y - line * (h + gap) >= h) return null;
    return this.rows[line * cols + col] || null;
  }

  hover(event) {
    const row = this.rowAt(event.clientX, event.clientY), tip = $("grid-tip");
    this.canvas.style.cursor = row && this.pick ? "pointer" : "";
    tip.hidden = !row;
    if (!row) return;
    tip.textContent = cellTip(row);
    Object.assign(tip.style, {left: `${event.clientX + 12}px`, top: `${event.clientY + 14}px`});
  }

  // where node `name`'s cell is (viewport coordinates of its centre, for a click) and what it says; null: not here
  cellAt(name) {
    const i = this.rows.findIndex((n) => n.name === name);
    if (i < 0) return null;
    const {w, h, gap, cols} = this.cell, box = this.box.getBoundingClientRect(), n = this.rows[i];
    const x = (i % cols) * (w + gap), y = Math.floor(i / cols) * (h + gap);
    return {name: n.name, state: n.state, lines: this.big ? cellLines(n) : [], tip: cellTip(n),
      x: box.left + x + w / 2, y: box.top + y + h / 2, width: w, height: h,
      drawn: !this.box.hidden && this.width > 0 && y >= this.top && y + h <= this.top + this.tall};
  }
}

// for tests and benchmarks: the grids' cells without an element each, the version held, a node's figures as held,
// and the Nodes list's page as the server answered it
window.slurmExt = {
  cellAt: (name, grid = "node-grid") => page.grids[grid === "state-grid" ? "state" : "nodes"].cellAt(name),
  cells: (grid = "node-grid") => page.grids[grid === "state-grid" ? "state" : "nodes"].rows
    .map((n) => ({name: n.name, state: n.state})),
  version: () => page.version,
  figures: (name) => page.figures.get(name) || null,
  listed: () => page.list.answer && {total: page.list.answer.total, offset: page.list.answer.offset,
    names: page.list.answer.rows.map((n) => n.name)},
};

// -- nodes ----------------------------------------------------------------------------------------------------------

// A node's figures as the page holds them (page.figures, changes.FIGURES): its GPUs' mean utilization (%), the share
// of their memory used, used and in all (MiB), the hottest one's temperature (C), how many are flagged idle; null
// where no GPU says it (a node without readings).
function nodeFigures(n) {
  return figuresNamed(page.figures.get(n.name));
}
function figuresNamed(f) {
  const [utilization, used, total, temperature, idle] = f || [];
  return {utilization: utilization ?? null, memory: used != null && total ? used / total : null, used: used ?? null,
    total: total ?? null, temperature: temperature ?? null, idle: idle || 0};
}
// A whole row's figures from its own GPUs' readings (a row of /api/nodes), as the server works them out
// (changes.figures_of): the list's columns then agree with the GPUs beside them and with the order the server sorted
// the rows in.
function rowFigures(n) {
  const readings = (n.gpu_readings || []).filter((g) => g && typeof g === "object");
  const numbers = (key) => readings.map((g) => g[key]).filter((v) => typeof v === "number" && Number.isFinite(v));
  const [busy, used, total, hot] = ["utilization", "memory_used_mib", "memory_total_mib", "temperature"].map(numbers);
  const sum = (values) => values.reduce((s, v) => s + v, 0);
  return figuresNamed([busy.length ? Math.round(sum(busy) / busy.length) : null,
    used.length ? Math.round(sum(used)) : null, total.length ? Math.round(sum(total)) : null,
    hot.length ? Math.max(...hot) : null, readings.filter((g) => g.idle).length]);
}

// The Nodes tab's filters as the server's /api/nodes takes them (web/nodelist.py), and the grid view applies them
// to the rows it holds: the state, and a part of the name (any case) or "=NAME", that node alone (as a click on the
// Overview's grid sets it). A lone "=" is nothing typed yet.
function nodeFilters() {
  const typed = $("node-name").value.trim();
  return {state: $("node-state").value, name: typed === "=" ? "" : typed};
}

// The Nodes grid's rows: filtered (nodeFilters) and sorted as the server sorts the list (ties by name, n2 before
// n10; a node without a figure first in ascending order; descending reverses all), over every row held; worked out
// again only when a row, a filter or the sort changed (or the figures, where it sorts by one).
function shownNodes(view) {
  const {state, name: typed} = nodeFilters();
  const key = page.sort.key, sign = page.sort.desc ? -1 : 1;
  const byFigure = ["utilization", "memory", "temperature"].includes(key);
  const asked = `${page.changes}|${byFigure ? page.moved : ""}|${state}|${typed}|${key}|${sign}`;
  if (page.shown && page.shown.asked === asked) return page.shown;
  const exact = typed.startsWith("=") ? typed.slice(1) : null, name = typed.toLowerCase();
  const value = (n) => {
    if (byFigure) return nodeFigures(n)[key] ?? -1;
    if (key === "state") return STATES.includes(n.state) ? STATES.indexOf(n.state) : STATES.length;
    if (key === "jobs") return (n.jobs || []).length;
    if (key === "gpus_used") return n.gpus_used || 0;
    if (key === "reason") return n.reason || "";
    return 0;  // name: by name alone
  };
  const rows = view.nodes.filter((n) => (!state || n.state === state) &&
    (exact !== null ? n.name === exact : !name || n.name.toLowerCase().includes(name)))
    .map((n) => [value(n), n])  // each row's value once, not once per comparison
    .sort(([x, a], [y, b]) => (x < y ? -1 : x > y ? 1 : byName.compare(a.name, b.name)) * sign)
    .map(([, n]) => n);
  page.shown = {asked, rows};
  return page.shown;
}

function opsOf(n) {
  const recommended = n.repair === "recommended";
  return `<span class="ops" data-node="${esc(n.name)}">` +
    `<button type="button" class="op op-check" data-op="check">run checks</button>` +
    (recommended ? `<select class="op-action">${["", "reboot", "reprovision", "failover", "remove"].map((a) =>
      `<option value="${a}">${a || "recommended"}</option>`).join("")}</select>` +
      `<button type="button" class="op op-approve" data-op="approve">approve repair</button>` +
      `<input class="op-why" placeholder="why reject"><button type="button" class="op op-reject" data-op="reject">reject</button>` : "") +
    `<button type="button" class="op op-ssh" data-op="ssh" data-command="${esc(n.ssh)}">copy ssh</button></span>`;
}

// The Nodes tab: the grid over the rows held (every node), or the list's page of whole rows asked of the server.
function drawNodes(view) {
  if (!view) return;
  for (const th of document.querySelectorAll("#node-table th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === page.sort.key);
    th.classList.toggle("desc", th.dataset.sort === page.sort.key && page.sort.desc);
  }
  const list = page.nodeView === "list";
  $("node-table").hidden = !list;
  $("node-pages").hidden = !list;
  $("node-grid").hidden = list;
  if (list) {
    askList();  // drawn when it answers (drawList); meanwhile the page held stays
    return;
  }
  const shown = shownNodes(view);
  $("node-shown").textContent = `${shown.rows.length} of ${counted(view.nodes.length, "node")}`;
  page.grids.nodes.show(shown.rows, `${shown.asked}|${page.moved}`);  // its cells say each node's utilization
}

// A filter or the sort changed: the list from its first row again.
function nodesAsked() {
  page.list.offset = 0;
  drawNodes(page.view);
}

// The list's page asked of /api/nodes with the filters, the sort and its offset; an answer older than the newest
// request is dropped (a filter typed fast, a poll beside it). A page past the end (nodes gone, a filter narrowed
// since) asks for the last page instead.
async function askList() {
  const {state, name} = nodeFilters();
  const query = new URLSearchParams({sort: page.sort.key, desc: page.sort.desc ? "1" : "0",
    offset: String(page.list.offset), limit: String(LIST_PAGE)});
  if (state) query.set("state", state);
  if (name) query.set("name", name);
  const asked = ++page.list.asked;
  try {
    const answer = await getJSON(`api/nodes?${query}`);
    if (asked !== page.list.asked) return;
    if (!answer.rows.length && answer.total && answer.offset >= answer.total) {
      page.list.offset = Math.floor((answer.total - 1) / LIST_PAGE) * LIST_PAGE;
      askList();
      return;
    }
    Object.assign(page.list, {answer, error: ""});
  } catch (err) {
    if (asked !== page.list.asked) return;
    Object.assign(page.list, {answer: null, error: err.message});  // e.g. a name with a character no node has
  }
  drawList();
}

function drawList() {
  const view = page.view, {answer, error} = page.list;
  if (!view) return;
  const total = answer ? answer.total : 0, first = answer ? answer.offset : 0, rows = answer ? answer.rows : [];
  $("node-shown").textContent = error ? "" : `${total} of ${counted(view.nodes.length, "node")}`;
  $("node-range").textContent = error ? `the list: ${error}` : rows.length ?
    `${first + 1}-${first + rows.length} of ${total}` : "no node matches";
  $("node-previous").disabled = error !== "" || first <= 0;
  $("node-next").disabled = error !== "" || first + rows.length >= total;
  const focused = document.activeElement && document.activeElement.closest("#node-table .ops");
  if (focused) return;  // an operator is typing a reason: the next poll draws
  const gpuLine = (g) => `<div class="gpu${g.idle ? " idle" : ""}" data-gpu="${esc(g.index)}">gpu ${esc(g.index)}: ` +
    `${esc(g.utilization ?? "-")} %, ${gib(g.memory_used_mib)}` +
    `${(g.holders || []).length ? " - " + g.holders.map((h) => `job ${esc(h.job_id)} (${esc(h.user || "?")})`).join(", ") : ""}` +
    `${g.idle ? ` <span class="idle-flag" title="held by a job and under ${esc(view.allocation.idle_below)} since ` +
      `${when(g.idle_since)}">idle ${age(view.refreshed - g.idle_since)}</span>` : ""}${g.error ? " " + esc(g.error) : ""}</div>`;
  $("node-table").tBodies[0].innerHTML = rows.map((n) => {
    const f = rowFigures(n);
    const findings = n.findings_shown || [];
    const gpus = (n.gpu_readings || []).map((g) => `gpu ${g.index}: ${g.utilization ?? "-"}% ` +
      `${gib(g.memory_used_mib)} ${g.temperature ?? "-"}C${g.error ? " " + g.error : ""}`).join("\n");
    const agent = n.agent || {};
    return `<tr data-node="${esc(n.name)}" data-state="${esc(n.state)}"><td>${esc(n.name)}</td>` +
      `<td><span class="badge ${esc(n.state)}">${esc(n.state)}</span> <span class="muted">${esc(n.slurm_state)}</span>` +
      `${n.repair ? `<br><span class="muted">repair: ${esc(n.repair)}</span>` : ""}` +
      `${(n.held || []).length ? `<br><span class="held">held: ${n.held.map(esc).join("; ")}</span>` : ""}</td>` +
      `<td>${esc(n.gpus_used)} / ${esc(n.gpus_total)}</td>` +
      `<td title="${esc(gpus)}">${f.utilization == null ? "-" : f.utilization.toFixed(0) + " %"}</td>` +
      `<td>${f.total ? gib(f.used) + " / " + gib(f.total) : "-"}</td>` +
      `<td>${f.temperature == null ? "-" : esc(f.temperature) + " C"}</td>` +
      `<td class="jobs">${(n.jobs || []).map((j) => `<div data-job="${esc(j.job_id)}">${esc(j.job_id)} ` +
        `(${esc(j.user)}, ${esc(j.partition)}${j.gpus.length ? ", gpu " + j.gpus.join(",") : ""})</div>`).join("") || "-"}</td>` +
      `<td class="gpus">${(n.gpu_readings || []).map(gpuLine).join("") || "-"}</td>` +
      `<td class="checks">${checkSummary(n.checks)}</td>` +
      `<td>${esc(n.reason) || "-"}${n.owner ? ` <span class="muted">(${esc(n.owner)})</span>` : ""}` +
      `${agent.error ? `<br><span class="muted">agent: ${esc(agent.error)}` +
        `${agent.answered ? `; its figures are ${age(view.refreshed - agent.answered)} old` : ""}</span>` : ""}` +
      `${agent.journal ? `<br><span class="muted">journal: ${esc(agent.journal)}</span>` : ""}</td>` +
      `<td>${findings.map(esc).join("<br>") || "-"}</td><td>${opsOf(n)}</td></tr>`;
  }).join("") || (error ? "" : `<tr><td colspan="12" class="muted">no node matches the filters</td></tr>`);
}

async function operate(button) {
  const ops = button.closest(".ops"), node = ops.dataset.node, op = button.dataset.op;
  if (op === "ssh") return copy(button.dataset.command);
  let body = {};
  if (op === "approve") body = {action: ops.querySelector(".op-action").value || undefined};
  // the row's finding alone (its subject: xid 48 of a GPU is not its xid 79, one mount point not another)
  if (op === "clear") body = {check: button.dataset.check, subject: button.dataset.subject || undefined};
  if (op === "reject") {
    body = {why: ops.querySelector(".op-why").value.trim()};
    if (!body.why) return say("a rejection needs its reason: type it beside the button", true);
  }
  button.disabled = true;
  say(`${op} ${node}: asked...`);
  try {
    const done = await post(`api/nodes/${encodeURIComponent(node)}/${op}`, body);
    say(op === "check" ? `health checks of ${node} (by ${done.user}): ${done.verdict}` :
      `${done.message} (by ${done.user})`);
    poll();
  } catch (err) {
    say(`${op} ${node} refused: ${err.message}`, true);
  } finally {
    button.disabled = false;
  }
}

function copy(text) {
  const area = $("clipboard");
  area.value = text;
  area.select();
  const done = () => say(`copied: ${text}`);
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => { document.execCommand("copy"); done(); });
  } else {
    document.execCommand("copy");
    done();
  }
}

// -- health checks ----------------------------------------------------------------------------------------------------

//: how the page says each state of a check (the health monitor's words; n/a: disabled or not applicable; not yet:
//: no reading judged since its monitor started, never shown as ok)
const CHECK_WORDS = {"ok": "ok", "warning": "warning", "critical": "critical", "failed": "failed",
  "disabled": "n/a", "not-applicable": "n/a", "pending": "not yet"};

function checkWord(state) { return CHECK_WORDS[state] || state || "-"; }

function checkSummary(checks) {
  const entries = Object.entries(checks || {});
  if (!entries.length) return `<span class="muted">no readings</span>`;
  const ok = entries.filter(([, s]) => s === "ok").length;
  const off = entries.filter(([, s]) => checkWord(s) === "n/a").length;
  const bad = entries.filter(([, s]) => s !== "ok" && checkWord(s) !== "n/a");
  const every = entries.map(([c, s]) => `${c}: ${checkWord(s)}`).join("\n");  // each check's state, on hover
  return `<span title="${esc(every)}">` + bad.map(([c, s]) =>
    `<span class="check ${esc(checkWord(s))}" data-check="${esc(c)}">${esc(c)}: ${esc(checkWord(s))}</span>`).join(" ") +
    `${bad.length ? "<br>" : ""}<span class="muted">${ok} ok${off ? `, ${off} n/a` : ""}</span></span>`;
}

function drawHealth(view) {
  nodeChoices($("health-node"), view);
  const node = $("health-node").value, check = $("health-check").value, severity = $("health-severity").value;
  const nodes = view.nodes.filter((n) => !node || n.name === node);
  const checks = [...new Set(nodes.flatMap((n) => Object.keys(n.checks || {})))]
    .filter((c) => !check || c === check).sort();
  $("check-states").tHead.rows[0].innerHTML = `<th>node</th>` + checks.map((c) => `<th>${esc(c)}</th>`).join("");
  $("check-states").tBodies[0].innerHTML = nodes.slice(0, CHECKS_MAX).map((n) =>
    `<tr data-node="${esc(n.name)}"><td>${esc(n.name)}</td>` +
    checks.map((c) => {
      const word = n.checks && c in n.checks ? checkWord(n.checks[c]) : "-";
      return `<td class="check ${esc(word)}" data-check="${esc(c)}">${esc(word)}</td>`;
    }).join("") + `</tr>`).join("") + (nodes.length > CHECKS_MAX ? `<tr><td colspan="${checks.length + 1}" ` +
      `class="muted">showing ${CHECKS_MAX} of ${nodes.length}: choose a node</td></tr>` : "") ||
    `<tr><td class="muted">no node</td></tr>`;
  const query = new URLSearchParams({limit: "300"});
  for (const [key, id] of [["node", "health-node"], ["check", "health-check"], ["severity", "health-severity"]]) {
    if ($(id).value) query.set(key, $(id).value);
  }
  drawAcceptance(node);
  getJSON(`api/health?${query}`).then((data) => {
    $("open-findings").tBodies[0].innerHTML = data.open.map((f) =>
      `<tr data-node="${esc(f.node)}" data-check="${esc(f.check)}"><td class="time">${when(f.opened || f.first_seen)}</td>` +
      `<td>${esc(f.node)}</td><td>${esc(f.check)}</td><td>${esc(f.severity)}</td><td>${esc(f.gpu ?? "")}</td>` +
      `<td>${esc(f.evidence)}</td><td>${esc(f.action)}</td><td><span class="ops" data-node="${esc(f.node)}">` +
      `<button type="button" class="op op-clear" data-op="clear" data-check="${esc(f.check)}" data-subject="${esc(f.subject ?? "")}" ` +
      `title="clear this finding and its drain (recorded with your name)">clear</button></span></td></tr>`).join("") ||
      `<tr><td colspan="8" class="muted">no finding open</td></tr>`;
    $("health-events").tBodies[0].innerHTML = data.entries.map((e) =>
      `<tr data-node="${esc(e.node)}" data-check="${esc(e.check)}" data-state="${esc(e.state)}"><td class="time">${when(e.time)}</td><td>${esc(e.node)}</td>` +
      `<td>${esc(e.event)}</td><td>${esc(e.check)}</td>` +
      `<td>${e.state === "cleared" ? `cleared${e.why ? " (" + esc(e.why) + ")" : ""}` : esc(e.severity)}</td><td>${esc(e.gpu ?? "")}</td>` +
      `<td>${esc(e.evidence || e.message)}${e.made_by_page ? ` <span class="muted">(${esc(e.message)})</span>` : ""}</td><td>${esc(e.action)}</td></tr>`).join("") ||
      `<tr><td colspan="8" class="muted">no health check events in the timeline window</td></tr>`;
  }).catch((err) => say(`health checks: ${err.message}`, true));
}

// a figure against its limit, as `slurm-ext accept show` says it: "h2d_gbps 55.4 GB/s (>= 48)"
function figureText(f) {
  const value = f.value == null ? "-" : Number(f.value.toPrecision(4));
  return `${f.name} ${value}${f.unit ? " " + f.unit : ""}` +
    (f.limit == null ? "" : ` (${f.at_least ? ">=" : "<="} ${f.limit})`);
}

function resultsTable(run) {
  return `<table class="results">` + run.results.map((r) =>
    `<tr data-test="${esc(r.test)}" data-outcome="${esc(r.outcome)}"><td>${esc(r.test)}</td><td>${esc(r.target) || "node"}</td>` +
    `<td class="verdict ${esc(r.outcome)}">${esc(r.outcome)}</td>` +
    `<td>${r.outcome === "pass" && r.figures.length ? r.figures.map((f) => esc(figureText(f))).join("; ") :
      esc(r.message) + (r.figures.length ? ` <span class="muted">(${r.figures.map((f) => esc(figureText(f))).join("; ")})</span>` : "")}` +
    `${r.outcome === "fail" && r.action !== "none" ? ` <span class="muted">recommended: ${esc(r.action)}</span>` : ""}</td></tr>`).join("") +
    Object.entries(run.not_applicable || {}).map(([test, why]) =>
      `<tr data-test="${esc(test)}" data-outcome="n/a"><td>${esc(test)}</td><td></td><td class="muted">n/a</td><td class="muted">${esc(why)}</td></tr>`).join("") +
    `</table>`;
}

function drawAcceptance(node) {
  getJSON(`api/acceptance${node ? "?node=" + encodeURIComponent(node) : ""}`).then((data) => {
    $("acceptance-switch").textContent = `acceptance tests ${acceptanceWords(data.acceptance)}` +
      (data.acceptance.offer ? `; ${data.acceptance.offer}` : "");
    const rows = data.nodes.filter((n) => n.summary);
    $("acceptance-runs").tBodies[0].innerHTML = rows.map((n) => {
      const s = n.summary;
      const results = n.run ? resultsTable(n.run) :  // from the journal's acceptance-done: its lines, as `history` shows them
        `<ul class="lines">${n.lines.map((l) => `<li>${esc(l)}</li>`).join("")}</ul>`;
      return `<tr data-node="${esc(n.node)}" data-verdict="${esc(s.verdict)}"><td>${esc(n.node)}</td>` +
        `<td class="verdict ${esc(s.verdict)}">${esc(s.verdict)}</td><td>${esc(s.level)}</td><td>${esc(s.trigger)}</td>` +
        `<td class="time">${when(s.finished)}</td><td>${esc(s.profile) || "-"}</td><td>${results}</td></tr>`;
    }).join("") || `<tr><td colspan="7" class="muted">no acceptance run known` +
      `${data.acceptance.enabled ? "" : " (acceptance is off: `slurm-ext accept run` on a node runs it by hand)"}</td></tr>`;
  }).catch((err) => say(`acceptance: ${err.message}`, true));
}

// -- repair -------------------------------------------------------------------------------------------------------------

function drawRepairs() {
  getJSON("api/repairs").then((data) => {
    const paused = $("repair-paused");
    paused.hidden = !data.paused;
    if (data.paused) paused.textContent = `Repairs are paused by ${data.paused.by} since ${when(data.paused.since)}.`;
    const focused = document.activeElement && document.activeElement.closest("#recommendations .ops");
    if (!focused) {
      $("recommendations").tBodies[0].innerHTML = data.open.map((r) => {
        const node = page.rows.get(r.node) || {name: r.node, ssh: "", repair: r.state};
        return `<tr data-node="${esc(r.node)}" data-state="${esc(r.state)}"><td>${esc(r.node)}</td><td>${esc(r.state)}${r.step ? " (" + esc(r.step) + ")" : ""}</td>` +
          `<td>${esc(r.action)}</td><td>${esc(r.signature)}</td><td>${esc(r.evidence)}</td><td>${esc(r.jobs.join(", ")) || "-"}</td>` +
          `<td class="time">${when(r.opened)}</td><td>${esc(r.decided_by) || "-"}${r.note ? ": " + esc(r.note) : ""}</td>` +
          `<td>${r.state === "recommended" ? opsOf({...node, repair: "recommended"}) : r.state === "rejected" ?
            `<span class="ops" data-node="${esc(r.node)}"><button type="button" class="op op-reopen" data-op="reopen" ` +
            `title="make it await approval again (recorded with your name)">reopen</button></span>` : ""}</td></tr>`;
      }).join("") || `<tr><td colspan="9" class="muted">no recommendation open</td></tr>`;
    }
    $("repairs").tBodies[0].innerHTML = data.history.map((r) =>
      `<tr data-node="${esc(r.node)}" data-record="${esc(r.id)}" data-state="${esc(r.state)}"><td>${esc(r.node)}</td><td>${esc(r.action)}</td>` +
      `<td>${esc(r.state)}${r.step && r.state === "running" ? " (" + esc(r.step) + ")" : ""}</td>` +
      `<td class="decided-by">${esc(r.decided_by) || "-"}</td><td class="time">${when(r.opened)}</td><td class="time">${when(r.closed)}</td>` +
      `<td><ol class="steps">${r.steps.map((s) => `<li><span class="muted">${when(s.time)}</span> ${esc(s.event)}: ${esc(s.message)}` +
        `${s.user ? ` <span class="muted">[${esc(s.user)}]</span>` : ""}</li>`).join("")}</ol></td>` +
      `<td>${esc(r.note) || (r.state === "done" ? "done" : "")}</td></tr>`).join("") ||
      `<tr><td colspan="8" class="muted">no repair in the timeline window</td></tr>`;
  }).catch((err) => say(`repair: ${err.message}`, true));
}

// -- tabs, sign-in, events -----------------------------------------------------------------------------------------------

function showTab() {
  $("grid-tip").hidden = true;  // its grid may be hidden under the pointer now
  page.tab = (location.hash || "#overview").slice(1);
  if (!["overview", "nodes", "health", "repair"].includes(page.tab)) page.tab = "overview";
  for (const tab of ["overview", "nodes", "health", "repair"]) {
    $(`tab-${tab}`).hidden = tab !== page.tab;
  }
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("on", link.dataset.tab === page.tab);
  if (page.view) draw();
}

// who this tab is: `ROLE: NAME (token|proxy)`, or a signed-in person as the history names them (`ROLE: NAME (oidc:SUB)`)
function showOperator() {
  const s = page.session || {}, who = s.user;
  const role = s.role || "no role";
  $("who").textContent = !who ? (token() ? "this token is not known" : "viewing") :
    s.via === "oidc" ? `${role}: ${who}` : `${role}: ${who} (${s.via})`;
  $("forget-token").hidden = !token();
  $("signin").hidden = !s.signin || s.via === "oidc";
  $("signout").hidden = s.via !== "oidc";
  // viewing needs sign-in and there is none: only the prompt is shown
  const prompt = Boolean(s.signin_needed);
  $("signin-prompt").hidden = !prompt;
  document.querySelector("main").hidden = prompt;
  $("tabs").hidden = prompt;
}

// what the server says of this tab's credentials and of the operators' tokens: a problem in red, a hint plainly;
// `why`: what a refused request said (an expired sign-in), shown with the sign-in prompt
async function showSession(why = "") {
  try {
    await askSession();
  } catch (err) {
    say(`session: ${err.message}`, true);
  }
  const problem = (page.session && page.session.problem) || why;
  if (problem) say(problem, true);
  else if (page.session && page.session.hint) hint(page.session.hint);
  else $("message").hidden = true;
  showOperator();
  const again = Boolean(page.session && page.session.signin && !page.session.user && /sign in again/.test(problem));
  if (again || (page.session && page.session.signin_needed)) {
    $("signin-said").textContent = again ? problem : "Viewing this page needs sign-in.";
    $("signin-prompt").hidden = false;
    if (/needs sign-in|sign in again/.test($("message").textContent)) $("message").hidden = true;  // said once
  }
}

async function signOut() {
  try {
    const done = await post("auth/logout", {});
    // no id_token_hint kept (a session of before a restart): the IdP is not asked, its session may be open still
    if (done.idp_session_open) window.alert(done.message);
    location.href = done.redirect || "/";
  } catch (err) {
    say(`sign-out: ${err.message}`, true);
  }
}

async function start() {
  page.grids = {
    state: new Grid($("state-grid"), false, (n) => {  // a click on a node: the Nodes tab shows it alone
      $("node-state").value = "";
      $("node-name").value = `=${n.name}`;
      location.hash = "#nodes";
    }),
    nodes: new Grid($("node-grid"), true, null),
  };
  let painting = false;
  const paint = () => {  // the cells in view, once a frame at most while the window scrolls or resizes
    if (painting) return;
    painting = true;
    requestAnimationFrame(() => { painting = false; for (const grid of Object.values(page.grids)) grid.paint(); });
  };
  window.addEventListener("scroll", paint, {passive: true});
  window.addEventListener("resize", paint);
  window.addEventListener("hashchange", showTab);
  $("operator").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem("slurm-ext-token", value);
    $("token").value = "";
    showSession();
  });
  $("signout").addEventListener("click", signOut);
  $("forget-token").addEventListener("click", () => { sessionStorage.removeItem("slurm-ext-token"); showSession(); });
  document.body.addEventListener("click", (event) => {
    const button = event.target.closest("button.op");
    if (button) operate(button);
    const th = event.target.closest("#node-table th[data-sort]");
    if (th) {
      page.sort = {key: th.dataset.sort, desc: page.sort.key === th.dataset.sort ? !page.sort.desc : false};
      nodesAsked();
    }
    const cell = event.target.closest("#state-counts .count");
    if (cell) { $("node-state").value = cell.dataset.state; location.hash = "#nodes"; }
  });
  for (const id of ["node-state", "node-name"]) $(id).addEventListener("input", nodesAsked);
  for (const [id, step] of [["node-previous", -LIST_PAGE], ["node-next", LIST_PAGE]]) {
    $(id).addEventListener("click", () => {
      page.list.offset = Math.max(0, page.list.offset + step);
      askList();
    });
  }
  for (const id of ["health-node", "health-check", "health-severity"]) {
    $(id).addEventListener("change", () => drawHealth(page.view));
  }
  for (const id of ["timeline-node", "timeline-source", "timeline-severity"]) $(id).addEventListener("change", drawTimeline);
  $("timeline-event").addEventListener("input", drawTimeline);
  const showView = (view) => {
    page.nodeView = view;
    sessionStorage.setItem("slurm-ext-node-view", view);  // the tab keeps the operator's choice
    $("view-list").classList.toggle("on", view === "list");
    $("view-grid").classList.toggle("on", view === "grid");
    if (page.view) drawNodes(page.view);
  };
  for (const [id, view] of [["view-list", "list"], ["view-grid", "grid"]]) $(id).addEventListener("click", () => showView(view));
  showView(page.nodeView);
  await showSession();
  $("health-check").innerHTML = `<option value="">all</option>` + (page.session ? page.session.checks || [] : [])
    .map((c) => `<option>${esc(c)}</option>`).join("");
  showTab();
  poll();
}

document.addEventListener("DOMContentLoaded", start);
