import { h, replace } from "./dom.js";
import { projects, rbac } from "./api.js";
import { confirmDialog, grantForm, parseSubject, revoke, rules, subjectID, subjectText } from "./grants.js";

// The Access page: who holds which role where in a project — now from the project's role
// bindings (ListProjectRoleBindings: a binding grants its template in every namespace the
// project owns, which is what WhoCan answers per namespace), at a past moment from AccessAt (per
// subject), and per namespace from WhoCan itself — and the grant and revoke of a role with a
// preview of what would change (the dry run).
//
// #/access?project=<name>[&at=<RFC 3339>][&subject=<kind:name>…][&row=N][&col=N]: at picks the
// moment; AccessAt answers per subject, so the subjects asked are the project's members now and
// every subject named (a subject whose binding is gone is found only by naming it). The matrix
// shows ROWS (ROWS_AT at a moment) subjects and COLS namespaces at a time (row, col: the first
// shown): one page's AccessAt calls and cells, whatever the project's size.
const ROWS = 50;
const COLS = 20;
// At a moment each subject shown is an AccessAt call whose answer holds every namespace's grant
// with its rules: fewer at a time keep a page within a second (20: ~0.5 s at 200 namespaces).
const ROWS_AT = 20;

// each runs fn over items, at most n calls at a time: a page of subjects asks AccessAt of each,
// and a burst of calls would queue behind the browser's connection limit and hold up every
// other call of the page.
async function each(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  return out;
}

// local writes instant d as a datetime-local value (the input shows and takes local time).
function local(d) {
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 23);
}

function hashOf(project, at, subjects, row, col) {
  const q = new URLSearchParams({ project });
  if (at) q.set("at", at.toISOString());
  for (const s of subjects || []) q.append("subject", subjectID(s));
  if (row) q.set("row", String(row));
  if (col) q.set("col", String(col));
  return "#/access?" + q;
}

const offset = (v) => (Number.isInteger(Number(v)) && Number(v) > 0 ? Number(v) : 0);

// placesCell lists where a role is held: every place when few, else how many and the first.
function placesCell(list) {
  if (!list.length) return h("span", { class: "muted" }, "no namespace yet");
  const sorted = list.slice().sort();
  if (sorted.length <= 6) return sorted.map((pl) => h("span", { class: "chip" }, pl));
  return [`${sorted.length} namespaces: `, sorted.slice(0, 3).map((pl) => h("span", { class: "chip" }, pl)), "…"];
}

const placeOf = (x) => `${x.cluster}/${x.namespace}`;

// grantsPlace mirrors rbac-sync's rule (rbacsync.grantsPlace): a namespace binding gives its
// namespace's RoleBindings to the project unless it is being unbound, or failed because the
// namespace is another project's.
function grantsPlace(b) {
  return b.phase !== "BINDING_PHASE_TERMINATING" && !(b.phase === "BINDING_PHASE_FAILED" && b.reason === "OwnedByOther");
}

function uniqueSubjects(list) {
  const seen = new Map();
  for (const s of list) if (s && !seen.has(subjectID(s))) seen.set(subjectID(s), s);
  return [...seen.values()].sort((a, b) => subjectID(a).localeCompare(subjectID(b)));
}

// parseSubjects reads a comma-separated list of subjects; error names the first it cannot read.
function parseSubjects(list) {
  const out = [];
  for (const text of list.map((s) => s.trim()).filter(Boolean)) {
    const s = parseSubject(text);
    if (!s) return { error: text };
    out.push(s);
  }
  return { subjects: out };
}

// matrix draws subjects (rows) × places (columns); cellOf(subject, place) is the roles held
// there: {template, missing (the template is deleted), gone (held then, not now)}.
function matrix(subjects, places, cellOf) {
  return h("table", { id: "access-matrix" },
    h("caption", { class: "muted" }, "Roles held, by subject (rows) and cluster/namespace (columns)"),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Subject"), places.map((p) => h("th", { scope: "col" }, p)))),
    h("tbody", {}, subjects.map((s) => h("tr", { "data-subject": subjectID(s) },
      h("th", { scope: "row" }, subjectText(s)),
      places.map((p) => {
        const held = cellOf(s, p);
        return h("td", { "data-place": p }, held.length
          ? held.map((x) => h("span", { class: "chip" + (x.gone ? " gone" : "") }, x.template,
            x.missing ? " (template deleted)" : "", x.gone ? " (no longer)" : ""))
          : h("span", { class: "muted" }, "–"));
      })))));
}

// whoCanPanel asks WhoCan about one namespace of the project (optionally for one verb on one
// resource): the server's own answer of who holds what there, RoleBinding and ClusterRole.
function whoCanPanel(places, failed) {
  const place = h("select", { id: "whocan-place", name: "place" }, places.map((p) => h("option", { value: placeOf(p) }, placeOf(p))));
  const verb = h("input", { id: "whocan-verb", name: "verb", autocomplete: "off", placeholder: "get" });
  const resource = h("input", { id: "whocan-resource", name: "resource", autocomplete: "off", placeholder: "pods" });
  const group = h("input", { id: "whocan-group", name: "group", autocomplete: "off", placeholder: "apps (empty: core)" });
  const out = h("div", { id: "whocan-out" });
  const form = h("form", { class: "toolbar", id: "whocan-form", "aria-label": "Who can, in one namespace" },
    h("div", {}, h("label", { for: "whocan-place" }, "Namespace"), place),
    h("div", {}, h("label", { for: "whocan-verb" }, "Verb (optional)"), verb),
    h("div", {}, h("label", { for: "whocan-resource" }, "Resource"), resource),
    h("div", {}, h("label", { for: "whocan-group" }, "API group"), group),
    h("button", { type: "submit", id: "whocan-ask" }, "Ask WhoCan"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const p = places.find((x) => placeOf(x) === place.value);
    if (!p) return;
    replace(out, h("p", { class: "muted" }, "Asking…"));
    let res;
    try {
      res = await rbac.whoCan(p.cluster, p.namespace, verb.value.trim(), resource.value.trim(), group.value.trim());
    } catch (e) {
      failed(out, e);
      return;
    }
    const gs = res.grants || [];
    replace(out, h("p", { class: "count", role: "status", id: "whocan-status" },
      `${placeOf(p)} (project ${res.project || "none"}): ${gs.length} grant${gs.length === 1 ? "" : "s"}`,
      verb.value.trim() ? ` allowing ${verb.value.trim()} ${resource.value.trim()}` : ""),
    gs.length ? h("table", { id: "whocan" },
      h("thead", {}, h("tr", {}, ["Subject", "Role template", "Granted through", "Rules"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, gs.map((g) => h("tr", { "data-grant": `${subjectID(g.subject)}|${g.roleTemplate}` },
        h("th", { scope: "row" }, subjectText(g.subject)),
        h("td", {}, g.roleTemplate, g.templateMissing ? " (template deleted)" : ""),
        h("td", {}, `RoleBinding ${g.roleBinding} → ClusterRole ${g.clusterRole}`,
          g.boundTime ? h("div", { class: "muted" }, `bound ${new Date(g.boundTime).toLocaleString()}`) : null),
        h("td", {}, rules(g.rules)))))) : null);
  });
  return h("section", { "aria-labelledby": "whocan-h" }, h("h2", { id: "whocan-h" }, "Who can, in one namespace"), form, out);
}

export async function accessPage(main, params, fail) {
  const body = h("div", { id: "access-body" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("h1", {}, "Access"), body);
  const failed = (el, e) => { if (!fail(e)) replace(el, h("p", { class: "error", role: "alert", id: "access-error" }, e.message)); };
  let ps, templates;
  try {
    [ps, templates] = await Promise.all([projects.list().then((r) => r.projects || []), rbac.templates().then((r) => r.templates || [])]);
  } catch (e) {
    failed(body, e);
    return;
  }
  if (!ps.length) {
    replace(body, h("p", { class: "muted", id: "no-projects" }, "No project you can read."));
    return;
  }
  const project = ps.some((p) => p.name === params.get("project")) ? params.get("project") : ps[0].name;
  const p = ps.find((x) => x.name === project);
  const byTemplate = new Map(templates.map((t) => [t.name, t]));

  const select = h("select", { id: "access-project", name: "project" },
    ps.map((x) => h("option", { value: x.name, selected: x.name === project }, x.displayName ? `${x.name} — ${x.displayName}` : x.name)));
  select.addEventListener("change", () => { location.hash = hashOf(select.value); });

  // The moment and the extra subjects come from the location, which anyone can put in a link:
  // what cannot be read is said, as text.
  let at = null;
  let problem = null;
  if (params.get("at")) {
    at = new Date(params.get("at"));
    if (Number.isNaN(at.getTime())) {
      problem = ["Not a time: ", params.get("at")];
      at = null;
    }
  }
  let extra = [];
  const parsed = parseSubjects(params.getAll("subject"));
  if (parsed.error !== undefined) problem = ["Not a subject (user:<name>, group:<name>, serviceaccount:<namespace>:<name>): ", parsed.error];
  else extra = parsed.subjects;

  const nowSec = Math.floor(Date.now() / 1000);
  const created = Math.floor(Date.parse(p.createTime || "") / 1000);
  const min = Number.isFinite(created) && created < nowSec ? created : nowSec - 86400;
  const atInput = h("input", { id: "at", name: "at", type: "datetime-local", step: "0.001", value: at ? local(at) : "" });
  const slider = h("input", { id: "at-slider", name: "slider", type: "range", min: String(min), max: String(nowSec), step: "1",
    value: String(at ? Math.min(nowSec, Math.max(min, Math.floor(at.getTime() / 1000))) : nowSec) });
  const sliderText = () => {
    const v = Number(slider.value);
    slider.setAttribute("aria-valuetext", v >= nowSec ? "now" : new Date(v * 1000).toLocaleString());
  };
  sliderText();
  const who = h("input", { id: "at-subjects", name: "subjects", autocomplete: "off", value: extra.map(subjectID).join(", "),
    placeholder: "user:alice, group:devs", "aria-describedby": "at-help" });
  const timeNote = h("div", { id: "at-note", role: "status" });
  const timeForm = h("form", { class: "toolbar", id: "at-form", "aria-label": "Who could, at a time" },
    h("div", {}, h("label", { for: "at" }, "At (local time; empty is now)"), atInput),
    h("div", {}, h("label", { for: "at-slider" }, "Time slider (project's creation to now)"), slider),
    h("div", {}, h("label", { for: "at-subjects" }, "Also ask about"), who),
    h("button", { type: "submit", id: "at-show" }, "Show"),
    h("a", { href: hashOf(project), id: "at-now" }, "Now"),
    h("p", { class: "muted", id: "at-help" },
      "The page asks about the project's members now; to see someone whose role is gone, name them (user:alice, group:devs, serviceaccount:ns:name)."),
    timeNote);

  const note = h("div", { id: "access-note", role: "status" });
  const view = h("div", { id: "access-view" });
  const dialog = confirmDialog();

  let row = offset(params.get("row"));
  let col = offset(params.get("col"));
  // The pager stays on the page (the view under it is redrawn), so a key press on it keeps
  // the focus.
  const pageStatus = h("span", { class: "muted", id: "access-page" });
  const pagers = {};
  for (const [id, text] of [["rows-prev", "Previous subjects"], ["rows-next", "Next subjects"], ["cols-prev", "Previous namespaces"], ["cols-next", "Next namespaces"]]) {
    pagers[id] = h("button", { type: "button", class: "secondary", id: "access-" + id }, text);
  }
  const pager = h("nav", { class: "pager", "aria-label": "Matrix pages", hidden: true }, pageStatus, Object.values(pagers));
  let shows = 0;
  // Subjects per page of the view on screen (ROWS now, ROWS_AT at a moment).
  let per = ROWS;

  // show draws the matrix at moment when (null: now) for the members and subjects asked.
  const show = async (when, asked) => {
    const gen = ++shows;
    view.dataset.shown = "";
    replace(view, h("p", { class: "muted" }, "Loading…"));
    let places, members, subjects, rows, then = null, left = 0;
    try {
      const [nsb, prb] = await Promise.all([projects.bindings(project), rbac.bindings(project)]);
      const seen = new Map();
      for (const b of nsb.bindings || []) {
        if (grantsPlace(b)) seen.set(placeOf(b), b);
        else left++;
      }
      places = [...seen.values()].sort((a, b) => placeOf(a).localeCompare(placeOf(b)));
      members = prb.bindings || [];
      subjects = uniqueSubjects([...members.map((b) => b.subject), ...(when ? asked : [])]);
      per = when ? ROWS_AT : ROWS;
      if (row >= subjects.length) row = 0;
      rows = subjects.slice(row, row + per);
      if (when) {
        then = (await each(rows, 8, (x) => rbac.accessAt(x, when.toISOString())))
          .flatMap((r) => r.grants || []).filter((g) => g.project === project);
      }
    } catch (e) {
      if (gen === shows) failed(view, e);
      return;
    }
    if (gen !== shows) return;
    // Now: a project role binding grants its template in every namespace the project owns.
    const placeSet = new Set(places.map(placeOf));
    const bySubject = new Map();
    for (const b of members) {
      const k = subjectID(b.subject);
      if (!bySubject.has(k)) bySubject.set(k, []);
      bySubject.get(k).push(b);
    }
    const heldNow = (sid, place, template) => placeSet.has(place) && (bySubject.get(sid) || []).some((b) => b.roleTemplate === template);
    const cells = new Map();
    let allCols = [...placeSet];
    if (then) {
      for (const g of then) {
        const k = subjectID(g.subject) + "|" + placeOf(g);
        if (!cells.has(k)) cells.set(k, []);
        cells.get(k).push({ template: g.roleTemplate, missing: g.templateMissing, gone: !heldNow(subjectID(g.subject), placeOf(g), g.roleTemplate) });
      }
      allCols = [...new Set([...allCols, ...then.map(placeOf)])];
    }
    allCols.sort();
    if (col >= allCols.length) col = 0;
    const cols = allCols.slice(col, col + COLS);
    const cellOf = (x, place) => then ? cells.get(subjectID(x) + "|" + place) || []
      : placeSet.has(place) ? (bySubject.get(subjectID(x)) || []).map((b) => ({ template: b.roleTemplate, missing: !byTemplate.has(b.roleTemplate) })) : [];

    // One row per subject and template of this page's subjects: where it is held, its rules,
    // and what grants it.
    const bound = new Map(members.map((b) => [`${subjectID(b.subject)}|${b.roleTemplate}`, b]));
    const shown = new Set(rows.map(subjectID));
    const list = new Map();
    if (then) {
      for (const g of then) {
        const k = `${subjectID(g.subject)}|${g.roleTemplate}`;
        if (!list.has(k)) list.set(k, { subject: g.subject, template: g.roleTemplate, rules: g.rules, missing: g.templateMissing, boundTime: g.boundTime, places: [] });
        list.get(k).places.push(placeOf(g));
      }
    } else {
      for (const b of members) {
        if (!shown.has(subjectID(b.subject))) continue;
        const t = byTemplate.get(b.roleTemplate);
        list.set(`${subjectID(b.subject)}|${b.roleTemplate}`, { subject: b.subject, template: b.roleTemplate, rules: t ? t.effectiveRules : [],
          missing: !t, boundTime: b.createTime, places: [...placeSet] });
      }
    }
    const detail = h("table", { id: "access-grants" },
      h("caption", { class: "muted" }, "Grants: the rules each subject holds and what grants them"),
      h("thead", {}, h("tr", {}, ["Subject", "Role template", "Rules", "Granted through", "Where", when ? null : "Change"]
        .filter(Boolean).map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, [...list.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([k, r]) => {
        const t = byTemplate.get(r.template);
        const b = bound.get(k);
        const gone = then && r.places.some((pl) => !heldNow(subjectID(r.subject), pl, r.template));
        return h("tr", { "data-grant": k, class: gone ? "gone" : "" },
          h("th", { scope: "row" }, subjectText(r.subject)),
          h("td", {}, r.template, t && t.displayName ? h("div", { class: "muted" }, t.displayName) : null),
          h("td", {}, r.missing ? h("span", { class: "error" }, "template deleted: nothing granted") : rules(r.rules)),
          h("td", {}, `RoleBinding fleetstream:${r.template} → ClusterRole fleetstream:${r.template}`,
            h("div", { class: "muted" }, `project role binding ${project}/${subjectID(r.subject)}:${r.template}`,
              r.boundTime ? `, bound ${new Date(r.boundTime).toLocaleString()}` : "", !then && b && b.creator ? ` by ${b.creator}` : "")),
          h("td", {}, placesCell(r.places), gone ? h("div", { class: "muted" }, "no longer held in all of these") : null),
          when ? null : h("td", {}, h("button", { type: "button", class: "secondary", "data-revoke": k,
            "aria-label": `Revoke ${r.template} from ${subjectText(r.subject)}`,
            onclick: () => revoke(project, r.subject, r.template, dialog, note, () => show(when, asked), fail) }, "Revoke…")));
      })));
    const range = (from, n, all) => (all ? `${from + 1}-${from + n} of ${all}` : "none");
    // Once shown it stays (until the page is left): a pager that vanished under the key that
    // turned it would drop the focus.
    if (subjects.length > per || allCols.length > COLS || row || col) pager.hidden = false;
    replace(pageStatus, `Subjects ${range(row, rows.length, subjects.length)}, namespaces ${range(col, cols.length, allCols.length)}`);
    // aria-disabled, not disabled: a disabled button drops the focus the key press left on it.
    const able = (id, ok) => pagers[id].setAttribute("aria-disabled", ok ? "false" : "true");
    able("rows-prev", row > 0);
    able("rows-next", row + per < subjects.length);
    able("cols-prev", col > 0);
    able("cols-next", col + COLS < allCols.length);
    replace(view,
      h("p", { class: "count", role: "status", id: "access-status" }, when
        ? `At ${when.toLocaleString()} (AccessAt): ${subjects.length} subject${subjects.length === 1 ? "" : "s"} asked, the members now and those named. "no longer" marks a role held then and not now.`
        : `Now: ${subjects.length} subject${subjects.length === 1 ? "" : "s"} with a role in ${project} (its project role bindings), each in all ${places.length} of its namespaces.`,
        left ? ` ${left} namespace${left === 1 ? " is" : "s are"} left out: being unbound, or another project's on the cluster (no RoleBindings there).` : ""),
      // Many namespaces make the matrix wider than the page: it scrolls in a region the
      // keyboard can reach (tabindex) and that says what it is.
      h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Access matrix" }, matrix(rows, cols, cellOf)),
      detail,
      whoCanPanel(places, failed));
    // Tests and tools wait on this for a view drawn without a page load (time control, grants).
    view.dataset.shown = when ? when.toISOString() : "now";
  };
  const turn = (dr, dc) => {
    if (pagers[dr < 0 ? "rows-prev" : dr > 0 ? "rows-next" : dc < 0 ? "cols-prev" : "cols-next"].getAttribute("aria-disabled") === "true") return;
    row = Math.max(0, row + dr);
    col = Math.max(0, col + dc);
    history.pushState(null, "", hashOf(project, at, extra, row, col));
    show(at, extra);
  };
  pagers["rows-prev"].addEventListener("click", () => turn(-per, 0));
  pagers["rows-next"].addEventListener("click", () => turn(per, 0));
  pagers["cols-prev"].addEventListener("click", () => turn(0, -COLS));
  pagers["cols-next"].addEventListener("click", () => turn(0, COLS));

  // apply reads the time form, keeps it in the location (a link shows the same view) and
  // redraws the view only: the form keeps the focus, and the slider can be moved by keys.
  const apply = () => {
    replace(timeNote);
    let when = null;
    if (atInput.value) {
      // The location's instant may be finer than the input: unchanged, it stays as it was.
      when = at && atInput.value === local(at) ? at : new Date(atInput.value);
      if (Number.isNaN(when.getTime())) {
        replace(timeNote, h("span", { class: "error", role: "alert", id: "at-error" }, "Not a time: ", atInput.value));
        return;
      }
    }
    const asked = parseSubjects(who.value.split(","));
    if (asked.error !== undefined) {
      replace(timeNote, h("span", { class: "error", role: "alert", id: "at-error" },
        "Not a subject (user:<name>, group:<name>, serviceaccount:<namespace>:<name>): ", asked.error));
      return;
    }
    at = when;
    extra = asked.subjects;
    history.pushState(null, "", hashOf(project, at, extra, row, col));
    show(at, extra);
  };
  timeForm.addEventListener("submit", (ev) => { ev.preventDefault(); apply(); });
  slider.addEventListener("input", () => {
    const v = Number(slider.value);
    atInput.value = v >= nowSec ? "" : local(new Date(v * 1000));
    sliderText();
  });
  slider.addEventListener("change", apply);

  replace(body,
    h("div", { class: "toolbar" }, h("div", {}, h("label", { for: "access-project" }, "Project"), select)),
    h("h2", { id: "access-title" }, p.displayName || p.name),
    timeForm,
    problem ? h("p", { class: "error", role: "alert", id: "at-error" }, problem) : null,
    note,
    pager,
    view,
    h("section", { "aria-labelledby": "grant-h" },
      h("h2", { id: "grant-h" }, "Grant a role"),
      h("p", { class: "muted" }, "The server is asked first what the grant would change (a dry run); nothing is granted until you confirm."),
      grantForm(project, templates, dialog, () => {
        // After a grant the view is of now, whatever moment it showed.
        at = null;
        atInput.value = "";
        slider.value = String(nowSec);
        sliderText();
        history.replaceState(null, "", hashOf(project, null, extra));
        return show(null, extra);
      }, fail)),
    dialog.el);
  if (!problem) await show(at, extra);
  else replace(view);
}
