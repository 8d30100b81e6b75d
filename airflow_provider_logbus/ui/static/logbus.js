// The Logbus page: plain DOM, no framework, no build step. Every number comes from the
// page's API (airflow_provider_logbus/ui/app.py), which runs the audit's own code.
"use strict";

const STATUSES = ["complete", "incomplete", "pending", "duplicated", "unrecorded", "no data"];
const LAG_REFRESH_MS = 10000;
const HOUR_MS = 3600000;
const $ = (id) => document.getElementById(id);
let tables = [];
let report = null;
let lagTimer = null;

// Airflow's UI root: this page is served at <root>/logbus/.
const airflowRoot = location.pathname.replace(/\/logbus\/?.*$/, "");

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node[k] = v;
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function cssStatus(status) { return status.replace(" ", "-"); }
function hourLabel(ms) { return new Date(ms).toISOString().slice(0, 13).replace("T", " ") + ":00Z"; }
function pct(x) { return (x * 100).toFixed(2) + "%"; }
function duration(ms) {
  if (ms === null || ms === undefined) return "unknown";
  if (ms === 0) return "up to date";
  const minutes = Math.round(ms / 60000);
  if (minutes < 120) return `${minutes} min`;
  return minutes < 72 * 60 ? `${(minutes / 60).toFixed(1)} h` : `${(minutes / 1440).toFixed(1)} d`;
}

async function api(path) {
  const answer = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  let body = null;
  try { body = await answer.json(); } catch (e) { body = null; }
  if (!answer.ok) {
    const failed = body && body.failed ? body.failed : null;
    const detail = body ? (body.error || body.detail || JSON.stringify(body)) : answer.statusText;
    const error = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    error.failed = failed;
    error.status = answer.status;
    throw error;
  }
  return body;
}

function showMessage(box, text, isError) {
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = false;
}

function errorText(error) {
  const what = { cluster: "the logbus cluster (ZooKeeper or brokers)", catalog: "the table's catalog",
                 table: "the table" }[error.failed];
  if (what) return `Cannot reach ${what}: ${error.message}`;
  if (error.status === 401 || error.status === 403) return `Not allowed: ${error.message}`;
  return `The page could not load its data: ${error.message}`;
}

function toLocalInput(ms) { return new Date(ms).toISOString().slice(0, 16); }
function fromLocalInput(value) { return value ? value + ":00Z" : ""; }

// a table is named in links (?table=) by any of its audits: one entry per table
function selectedTable() { return tables.find((t) => t.key === $("table").value); }
function tableOfAudit(key) { return tables.find((t) => t.audits.some((a) => a.key === key)); }
function tablePath(t) { return `api/tables/${encodeURIComponent(t.dag_id)}/${encodeURIComponent(t.task_id)}`; }

async function loadTables() {
  const answer = await api("api/tables");
  tables = answer.tables;
  const select = $("table");
  select.replaceChildren(...tables.map((t) => el("option", { value: t.key },
    `${t.table} (${t.target}, topic ${t.topic}; audited by ${t.audits.map((a) => a.key).join(", ")})`)));
  const wanted = tableOfAudit(new URLSearchParams(location.search).get("table"));
  if (wanted) select.value = wanted.key;
}

async function loadHours() {
  const t = selectedTable();
  $("hour").hidden = true;
  const params = new URLSearchParams();
  if ($("start").value) params.set("start", fromLocalInput($("start").value));
  if ($("end").value) params.set("end", fromLocalInput($("end").value));
  report = await api(`${tablePath(t)}/hours?${params}`);
  if (!$("start").value) $("start").value = toLocalInput(report.start_ms);
  if (!$("end").value) $("end").value = toLocalInput(report.end_ms);
  drawGrid();
  drawChart();
}

function drawWatermark() {
  const through = report.complete_through_ms;
  $("watermark").textContent = through ? `complete through ${hourLabel(through)}` : "no hour announced complete yet";
  $("watermark").setAttribute("data-complete-through", through ?? "");
  $("watermark").setAttribute("data-announced-through", report.announced_through_ms ?? "");
  const box = $("withdrawn");
  box.setAttribute("data-hours", report.withdrawn.map((h) => h.hour).join(" "));
  if (report.withdrawn.length) {
    box.textContent = `Announced complete through ${hourLabel(report.announced_through_ms)}, but no longer complete: ` +
      report.withdrawn.map((h) => `${hourLabel(h.hour_ms)} (${h.status})`).join(", ") +
      ". The next audit withdraws them and fails; downstream consumers may have read these hours.";
  } else if (report.withdrawal) {
    const w = report.withdrawal;
    box.textContent = `Audit run ${w.run_id} withdrew ${w.withdrawn.join(", ")} (it had been announced complete; ` +
      `complete through was ${hourLabel(w.withdrawn_from_ms)}).`;
  }
  box.hidden = !(report.withdrawn.length || report.withdrawal);
}

function drawGrid() {
  const through = report.complete_through_ms;
  drawWatermark();
  $("legend").replaceChildren(...STATUSES.map((s) => el("span", { class: cssStatus(s) }, s)));
  const cells = report.hours.map((h) => {
    const status = h.display_status;
    const title = `${hourLabel(h.hour_ms)}: ${status}\nproduced ${h.produced}, loaded ${h.loaded}, ` +
      `rejected ${h.rejected}, missing ${h.missing}, duplicated ${h.duplicated}, completeness ${pct(h.completeness)}` +
      h.tiers.map((tier) => `\n  ${tier.tier}: ${tier.count}` +
        (tier.missing ? `, missing ${tier.missing}` : "") + (tier.duplicated ? `, duplicated ${tier.duplicated}` : "")).join("") +
      (h.verdicts.length > 1 ? "\n" + h.verdicts.map((v) => `${v.audit}: ${v.status}`).join(", ") : "");
    return el("div", {
      class: `cell ${cssStatus(status)}${through && h.hour_ms < through ? " through" : ""}`, title,
      "data-hour": h.hour, "data-hour-ms": h.hour_ms, "data-status": status, "data-produced": h.produced,
      "data-loaded": h.loaded, "data-rejected": h.rejected, "data-missing": h.missing,
      "data-duplicated": h.duplicated, "data-completeness": h.completeness,
      "data-verdicts": h.verdicts.map((v) => `${v.audit}=${v.status}`).join(" "),
      onclick: (event) => selectHour(h, event.currentTarget),
    }, new Date(h.hour_ms).getUTCHours());
  });
  $("grid").replaceChildren(...cells);
  if (!report.hours.some((h) => h.display_status !== "no data")) {
    showMessage($("message"), "No data in this range: no producer, mirror, broker or table counted a message in these hours.", false);
  } else {
    $("message").hidden = true;
  }
}

function drawChart() {
  const svg = $("chart");
  const hours = report.hours;
  const max = Math.max(1, ...hours.map((h) => h.loaded));
  const width = 1000, height = 90, gap = 2;
  const bar = width / Math.max(hours.length, 24);  // under a day, bars line up with the grid's first row
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.replaceChildren(...hours.map((h, i) => {
    const rect = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const barHeight = Math.round((h.loaded / max) * (height - 4));
    rect.setAttribute("x", i * bar + gap / 2);
    rect.setAttribute("width", Math.max(bar - gap, 1));
    rect.setAttribute("y", height - barHeight);
    rect.setAttribute("height", barHeight);
    rect.setAttribute("data-loaded", h.loaded);
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = `${hourLabel(h.hour_ms)}: ${h.loaded} rows loaded`;
    rect.append(title);
    return rect;
  }));
}

function runLink(t, runId) {
  if (!runId) return "";
  const dag = t.load_dag_id || t.dag_id;  // the DAG that commits the table's batches
  return el("a", { href: `${airflowRoot}/dags/${encodeURIComponent(dag)}/runs/${encodeURIComponent(runId)}`,
                   target: "_top", class: "run-link" }, runId);
}

function fillTable(id, headers, rows, empty) {
  $(id).replaceChildren(el("tr", {}, ...headers.map((name) => el("th", {}, name))), ...rows);
  if (!rows.length && empty) $(id).append(el("tr", {}, el("td", { colSpan: headers.length }, empty)));
}

function selectHour(h, cell) {
  const t = selectedTable();
  document.querySelectorAll(".cell.selected").forEach((c) => c.classList.remove("selected"));
  cell.classList.add("selected");
  $("hour").hidden = false;
  $("rejects").hidden = true;
  $("snapshot").hidden = true;
  $("hour-title").textContent = `${hourLabel(h.hour_ms)}: ${h.display_status}, completeness ${pct(h.completeness)}`;
  fillTable("verdicts", ["audit", "threshold", "grace", "verdict"], h.verdicts.map((v) => {
    const audit = t.audits.find((a) => a.key === v.audit);
    return el("tr", { "data-audit": v.audit, "data-status": v.status }, el("td", {}, v.audit),
      el("td", {}, pct(audit.threshold)), el("td", {}, `${Math.round(audit.grace_ms / 60000)} min`), el("td", {}, v.status));
  }));
  $("hour-reasons").replaceChildren(...h.reasons.map((reason) => el("li", {}, reason)));
  $("why").hidden = !h.reasons.length;
  fillTable("tiers", ["tier", "count", "missing", "duplicated"], h.tiers.map((tier) => el("tr", { "data-tier": tier.tier },
    el("td", {}, tier.tier), el("td", {}, tier.count), el("td", {}, tier.missing ?? ""), el("td", {}, tier.duplicated ?? ""))));
  fillTable("batches", ["batch", "run", "snapshot", "offset ranges", "rows in hour", "rejected in hour", ""],
    h.batches.map((b) => el("tr", { "data-batch-id": b.batch_id },
      el("td", {}, b.batch_id), el("td", {}, runLink(t, b.run_id)), el("td", {}, b.snapshot_id ?? ""),
      el("td", {}, b.ranges.map((r) => `p${r.partition} [${r.start}, ${r.end})`).join(", ")),
      el("td", {}, b.rows), el("td", {}, b.rejected),
      el("td", {}, b.batch_rejected ? el("a", { href: "#", class: "rejects-link",
        onclick: (event) => { event.preventDefault(); showRejects(t, b.batch_id); } }, "rejects") : ""))),
    "No batch loaded rows of this hour.");
  const outside = h.outside_batches || [];
  fillTable("outside", ["file", "rows", "added by snapshot"], outside.map((f) => el("tr", { "data-path": f.path,
    "data-rows": f.rows }, el("td", {}, f.path), el("td", {}, f.rows),
    el("td", {}, f.snapshot_id ? el("a", { href: "#", class: "snapshot-link", "data-snapshot-id": f.snapshot_id,
      onclick: (event) => { event.preventDefault(); showSnapshot(t, f.snapshot_id); } }, f.snapshot_id) : ""))));
  $("outside-section").hidden = !outside.length;
  const off = h.batches_off || [];
  fillTable("batches-off", ["batch", "rows its files hold", "rows its record claims"], off.map((b) => el("tr",
    { "data-batch-id": b.batch_id }, el("td", {}, b.batch_id), el("td", {}, b.held), el("td", {}, b.recorded))));
  $("batches-off-section").hidden = !off.length;
}

async function showSnapshot(t, snapshotId) {
  const box = $("snapshot");
  box.hidden = false;
  box.replaceChildren(el("p", {}, `Loading snapshot ${snapshotId}…`));
  try {
    const s = await api(`${tablePath(t)}/snapshots/${encodeURIComponent(snapshotId)}`);
    box.replaceChildren(
      el("h3", {}, `Snapshot ${s.snapshot_id}`),
      el("p", { class: "muted" }, `${s.operation ?? "?"}, committed ${s.committed_at}, parent ${s.parent_id ?? "none"}` +
        (s.summary["logbus.batch-id"] ? "" : " — not a logbus batch: it came in outside the commit protocol")),
      el("table", { id: "snapshot-summary" }, ...Object.entries(s.summary).map(([k, v]) => el("tr", { "data-key": k },
        el("td", {}, k), el("td", {}, v)))));
  } catch (error) {
    showMessage(box, errorText(error), true);
  }
}

async function showRejects(t, batchId) {
  const box = $("rejects");
  box.hidden = false;
  box.replaceChildren(el("p", {}, `Loading the rejects of batch ${batchId}…`));
  try {
    const answer = await api(`${tablePath(t)}/rejects/${encodeURIComponent(batchId)}`);
    box.replaceChildren(
      el("h3", {}, `Rejects of batch ${batchId} (first ${answer.rows.length})`),
      el("table", {}, el("tr", {}, ...["partition", "offset", "timestamp", "error", "value"].map((n) => el("th", {}, n))),
        ...answer.rows.map((r) => el("tr", {}, el("td", {}, r.partition), el("td", {}, r.offset),
          el("td", {}, r.timestamp ?? ""), el("td", {}, r.error), el("td", {}, r.value ?? "")))),
      el("p", { class: "muted" }, `files: ${answer.files.join(", ")}`));
  } catch (error) {
    showMessage(box, errorText(error), true);
  }
}

async function loadLag() {
  const t = selectedTable();
  if (!t) return;
  try {
    const answer = await api(`${tablePath(t)}/lag`);
    $("lag-message").hidden = true;
    $("lag-topic").textContent = `topic ${answer.topic}, refreshed ${new Date().toISOString().slice(11, 19)}Z`;
    $("lag").replaceChildren(
      el("tr", {}, ...["partition", "leader", "committed in table", "latest at broker", "lag (records)", "behind"]
        .map((n) => el("th", {}, n))),
      ...answer.partitions.map((p) => el("tr", {
        "data-partition": p.partition, "data-committed": p.committed ?? "", "data-latest": p.latest,
        "data-lag-records": p.lag_records }, el("td", {}, p.partition), el("td", {}, p.leader),
        el("td", {}, p.committed ?? "none"), el("td", {}, p.latest), el("td", {}, p.lag_records),
        el("td", {}, duration(p.behind_ms)))));
  } catch (error) {
    $("lag").replaceChildren();
    showMessage($("lag-message"), errorText(error), true);
  }
}

async function show() {
  $("content").hidden = false;
  try {
    await loadHours();
  } catch (error) {
    $("grid").replaceChildren();
    $("chart").replaceChildren();
    showMessage($("message"), errorText(error), true);
  }
  clearInterval(lagTimer);
  await loadLag();
  lagTimer = setInterval(loadLag, LAG_REFRESH_MS);
}

async function start() {
  try {
    await loadTables();
  } catch (error) {
    showMessage($("message"), errorText(error), true);
    return;
  }
  if (!tables.length) {
    showMessage($("message"), "No logbus tables yet: the page shows the tables of the LogbusAuditOperator tasks " +
      "in the DAGs you may read. Add an audit task to a DAG (see the example logbus_hourly_load).", false);
    return;
  }
  const params = new URLSearchParams(location.search);  // ?table=&start=&end= (UTC, ISO 8601) link to a view
  for (const name of ["start", "end"]) {
    if (params.get(name)) $(name).value = params.get(name).replace(/Z$/, "").slice(0, 16);
  }
  $("controls").addEventListener("submit", (event) => { event.preventDefault(); show(); });
  $("table").addEventListener("change", () => { $("start").value = ""; $("end").value = ""; show(); });
  await show();
}

start();
