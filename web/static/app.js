// slurm-ext cluster page: plain JavaScript, no framework, nothing fetched from elsewhere.
// It polls the server's one shared view of the cluster (/api/cluster) every refresh interval and draws the tab on
// show; operations POST with the page's CSRF token and the operator's token (kept in this tab's sessionStorage).
"use strict";

const STATES = ["healthy", "booting", "unhealthy", "pending", "paused"];
const page = {
  view: null, session: null, lastGood: 0, tab: "overview",
  sort: {key: "name", desc: false}, nodeView: sessionStorage.getItem("slurm-ext-node-view") || "list", timer: null,
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
  try {
    page.view = await getJSON("api/cluster");
    page.lastGood = Date.now() / 1000;
  } catch (err) {
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
  $("state-grid").innerHTML = view.nodes.map((n) =>
    `<div class="cell ${esc(n.state)}" title="${esc(n.name)}: ${esc(n.state)}${n.reason ? " - " + esc(n.reason) : ""}">${esc(n.name)}</div>`).join("");
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

// -- nodes ----------------------------------------------------------------------------------------------------------

function nodeFigures(n) {
  const readings = n.gpu_readings || [];
  const util = readings.filter((g) => g.utilization != null);
  const used = readings.reduce((s, g) => s + (g.memory_used_mib || 0), 0);
  const total = readings.reduce((s, g) => s + (g.memory_total_mib || 0), 0);
  const temps = readings.filter((g) => g.temperature != null).map((g) => g.temperature);
  return {
    utilization: util.length ? util.reduce((s, g) => s + g.utilization, 0) / util.length : null,
    memory: total ? used / total : null, used, total,
    temperature: temps.length ? Math.max(...temps) : null,
  };
}

function shownNodes(view) {
  const state = $("node-state").value, name = $("node-name").value.trim().toLowerCase();
  const rows = view.nodes.filter((n) => (!state || n.state === state) && (!name || n.name.toLowerCase().includes(name)));
  const key = page.sort.key, sign = page.sort.desc ? -1 : 1;
  const value = (n) => {
    if (["utilization", "memory", "temperature"].includes(key)) return nodeFigures(n)[key] ?? -1;
    if (key === "state") return STATES.indexOf(n.state);
    if (key === "jobs") return (n.jobs || []).length;
    return n[key] ?? "";
  };
  return rows.sort((a, b) => {
    const x = value(a), y = value(b);
    return (x < y ? -1 : x > y ? 1 : a.name.localeCompare(b.name, undefined, {numeric: true})) * sign;
  });
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

function drawNodes(view) {
  const rows = shownNodes(view);
  $("node-shown").textContent = `${rows.length} of ${counted(view.nodes.length, "node")}`;
  for (const th of document.querySelectorAll("#node-table th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === page.sort.key);
    th.classList.toggle("desc", th.dataset.sort === page.sort.key && page.sort.desc);
  }
  $("node-table").hidden = page.nodeView !== "list";
  $("node-grid").hidden = page.nodeView !== "grid";
  if (page.nodeView === "grid") {
    $("node-grid").innerHTML = rows.map((n) => {
      const f = nodeFigures(n);
      return `<div class="cell ${esc(n.state)}" data-node="${esc(n.name)}" title="${esc(n.name)}: ${esc(n.state)}` +
        `${n.reason ? " - " + esc(n.reason) : ""}${(n.held || []).length ? "; held: " + esc(n.held.join("; ")) : ""}` +
        `">${esc(n.name)}<br>${esc(n.gpus_used)}/${esc(counted(n.gpus_total, "GPU"))}` +
        `${f.utilization == null ? "" : " " + f.utilization.toFixed(0) + "%"}</div>`;
    }).join("");
    return;
  }
  const focused = document.activeElement && document.activeElement.closest("#node-table .ops");
  const gpuLine = (g) => `<div class="gpu${g.idle ? " idle" : ""}" data-gpu="${esc(g.index)}">gpu ${esc(g.index)}: ` +
    `${g.utilization ?? "-"} %, ${gib(g.memory_used_mib)}` +
    `${(g.holders || []).length ? " - " + g.holders.map((h) => `job ${esc(h.job_id)} (${esc(h.user || "?")})`).join(", ") : ""}` +
    `${g.idle ? ` <span class="idle-flag" title="held by a job and under ${esc(view.allocation.idle_below)} since ` +
      `${when(g.idle_since)}">idle ${age(view.refreshed - g.idle_since)}</span>` : ""}${g.error ? " " + esc(g.error) : ""}</div>`;
  if (focused) return;  // an operator is typing a reason: the next poll draws
  $("node-table").tBodies[0].innerHTML = rows.map((n) => {
    const f = nodeFigures(n);
    const findings = n.findings_shown || [];
    const gpus = (n.gpu_readings || []).map((g) => `gpu ${g.index}: ${g.utilization ?? "-"}% ` +
      `${gib(g.memory_used_mib)} ${g.temperature ?? "-"}C${g.error ? " " + g.error : ""}`).join("\n");
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
      `${n.agent.error ? `<br><span class="muted">agent: ${esc(n.agent.error)}` +
        `${n.agent.answered ? `; its figures are ${age(view.refreshed - n.agent.answered)} old` : ""}</span>` : ""}` +
      `${n.agent.journal ? `<br><span class="muted">journal: ${esc(n.agent.journal)}</span>` : ""}</td>` +
      `<td>${findings.map(esc).join("<br>") || "-"}</td><td>${opsOf(n)}</td></tr>`;
  }).join("");
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
  $("check-states").tBodies[0].innerHTML = nodes.map((n) => `<tr data-node="${esc(n.name)}"><td>${esc(n.name)}</td>` +
    checks.map((c) => {
      const word = n.checks && c in n.checks ? checkWord(n.checks[c]) : "-";
      return `<td class="check ${esc(word)}" data-check="${esc(c)}">${esc(word)}</td>`;
    }).join("") + `</tr>`).join("") || `<tr><td class="muted">no node</td></tr>`;
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
        const node = (page.view.nodes.find((n) => n.name === r.node) || {name: r.node, ssh: "", repair: r.state});
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
      drawNodes(page.view);
    }
    const cell = event.target.closest("#state-counts .count");
    if (cell) { $("node-state").value = cell.dataset.state; location.hash = "#nodes"; }
  });
  for (const id of ["node-state", "node-name"]) $(id).addEventListener("input", () => drawNodes(page.view));
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
