import { h, replace } from "./dom.js";
import { projects, rbac } from "./api.js";
import { confirmDialog, grantForm, parseSubject, revoke, rules, subjectID, subjectText } from "./grants.js";

// The Access page: who holds which role where in a project, as the server answers it now
// (WhoCan, per namespace of the project) or at a past moment (AccessAt, per subject), and the
// grant and revoke of a role with a preview of what would change (the dry run).
//
// #/access?project=<name>[&at=<RFC 3339>][&subject=<kind:name>…]: at picks the moment; AccessAt
// answers per subject, so the subjects asked are the project's members now and every subject
// named (a subject whose binding is gone is found only by naming it).

// each runs fn over items, at most n calls at a time: a project with many namespaces asks WhoCan
// of each, and a burst of hundreds of calls would queue behind the browser's connection limit
// and hold up every other call of the page.
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

function hashOf(project, at, subjects) {
  const q = new URLSearchParams({ project });
  if (at) q.set("at", at.toISOString());
  for (const s of subjects || []) q.append("subject", subjectID(s));
  return "#/access?" + q;
}

const placeOf = (x) => `${x.cluster}/${x.namespace}`;

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

function matrix(subjects, places, grants, gone) {
  const cells = new Map();
  for (const g of grants) {
    const k = subjectID(g.subject) + "|" + placeOf(g);
    if (!cells.has(k)) cells.set(k, []);
    cells.get(k).push(g);
  }
  return h("table", { id: "access-matrix" },
    h("caption", { class: "muted" }, "Roles held, by subject (rows) and cluster/namespace (columns)"),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Subject"), places.map((p) => h("th", { scope: "col" }, p)))),
    h("tbody", {}, subjects.map((s) => h("tr", { "data-subject": subjectID(s) },
      h("th", { scope: "row" }, subjectText(s)),
      places.map((p) => {
        const gs = cells.get(subjectID(s) + "|" + p) || [];
        return h("td", { "data-place": p }, gs.length
          ? gs.map((g) => {
            const no = gone && gone(g);
            return h("span", { class: "chip" + (no ? " gone" : "") }, g.roleTemplate,
              g.templateMissing ? " (template deleted)" : "", no ? " (no longer)" : "");
          })
          : h("span", { class: "muted" }, "–"));
      })))));
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
  let shows = 0;

  // show draws the matrix at moment when (null: now) for the members and subjects asked.
  const show = async (when, asked) => {
    const gen = ++shows;
    view.dataset.shown = "";
    replace(view, h("p", { class: "muted" }, "Loading…"));
    let places, members, now, then = null;
    try {
      const [nsb, prb] = await Promise.all([projects.bindings(project), rbac.bindings(project)]);
      const seen = new Map();
      for (const b of nsb.bindings || []) seen.set(placeOf(b), b);
      places = [...seen.values()].sort((a, b) => placeOf(a).localeCompare(placeOf(b)));
      members = prb.bindings || [];
      now = (await each(places, 8, (pl) => rbac.whoCan(pl.cluster, pl.namespace)))
        .flatMap((r) => r.grants || []).filter((g) => g.project === project);
      if (when) {
        const subjects = uniqueSubjects([...members.map((b) => b.subject), ...asked]);
        then = (await each(subjects, 8, (s) => rbac.accessAt(s, when.toISOString())))
          .flatMap((r) => r.grants || []).filter((g) => g.project === project);
      }
    } catch (e) {
      if (gen === shows) failed(view, e);
      return;
    }
    if (gen !== shows) return;
    const key = (g) => `${subjectID(g.subject)}|${placeOf(g)}|${g.roleTemplate}`;
    const current = new Set(now.map(key));
    const grants = then || now;
    const subjects = uniqueSubjects([...grants.map((g) => g.subject), ...members.map((b) => b.subject), ...(when ? asked : [])]);
    const cols = [...new Set([...places.map(placeOf), ...grants.map(placeOf)])].sort();
    const bound = new Map(members.map((b) => [`${subjectID(b.subject)}|${b.roleTemplate}`, b]));
    // One row per subject and template: where it holds it, its rules, and what grants it.
    const rows = new Map();
    for (const g of grants) {
      const k = `${subjectID(g.subject)}|${g.roleTemplate}`;
      if (!rows.has(k)) rows.set(k, { subject: g.subject, template: g.roleTemplate, grant: g, places: [] });
      rows.get(k).places.push(placeOf(g));
    }
    if (!when) {
      for (const b of members) {
        const k = `${subjectID(b.subject)}|${b.roleTemplate}`;
        if (!rows.has(k)) rows.set(k, { subject: b.subject, template: b.roleTemplate, grant: null, places: [] });
      }
    }
    const list = [...rows.values()].sort((a, b) => (subjectID(a.subject) + "|" + a.template).localeCompare(subjectID(b.subject) + "|" + b.template));
    const detail = h("table", { id: "access-grants" },
      h("caption", { class: "muted" }, "Grants: the rules each subject holds and what grants them"),
      h("thead", {}, h("tr", {}, ["Subject", "Role template", "Rules", "Granted through", "Where", when ? null : "Change"]
        .filter(Boolean).map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, list.map((r) => {
        const t = byTemplate.get(r.template);
        const b = bound.get(`${subjectID(r.subject)}|${r.template}`);
        const boundTime = (r.grant && r.grant.boundTime) || (b && b.createTime);
        const gone = when && r.places.some((pl) => !current.has(`${subjectID(r.subject)}|${pl}|${r.template}`));
        return h("tr", { "data-grant": `${subjectID(r.subject)}|${r.template}`, class: gone ? "gone" : "" },
          h("th", { scope: "row" }, subjectText(r.subject)),
          h("td", {}, r.template, t && t.displayName ? h("div", { class: "muted" }, t.displayName) : null),
          h("td", {}, r.grant ? (r.grant.templateMissing ? h("span", { class: "error" }, "template deleted: nothing granted") : rules(r.grant.rules))
            : rules(t ? t.effectiveRules : [])),
          h("td", {}, `RoleBinding ${r.grant ? r.grant.roleBinding : "fleetstream:" + r.template} → ClusterRole ${r.grant ? r.grant.clusterRole : "fleetstream:" + r.template}`,
            h("div", { class: "muted" }, `project role binding ${project}/${subjectID(r.subject)}:${r.template}`,
              boundTime ? `, bound ${new Date(boundTime).toLocaleString()}` : "", b && b.creator ? ` by ${b.creator}` : "")),
          h("td", {}, r.places.length ? r.places.sort().map((pl) => h("span", { class: "chip" }, pl)) : h("span", { class: "muted" }, "no namespace yet"),
            gone ? h("div", { class: "muted" }, "no longer held in all of these") : null),
          when ? null : h("td", {}, h("button", { type: "button", class: "secondary", "data-revoke": `${subjectID(r.subject)}|${r.template}`,
            "aria-label": `Revoke ${r.template} from ${subjectText(r.subject)}`,
            onclick: () => revoke(project, r.subject, r.template, dialog, note, () => show(when, asked), fail) }, "Revoke…")));
      })));
    replace(view,
      h("p", { class: "count", role: "status", id: "access-status" }, when
        ? `At ${when.toLocaleString()} (AccessAt): ${subjects.length} subject${subjects.length === 1 ? "" : "s"} asked, the members now and those named. "no longer" marks a role held then and not now.`
        : `Now (WhoCan): ${subjects.length} subject${subjects.length === 1 ? "" : "s"} in ${places.length} namespace${places.length === 1 ? "" : "s"} of ${project}.`),
      // Many namespaces make the matrix wider than the page: it scrolls in a region the
      // keyboard can reach (tabindex) and that says what it is.
      h("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Access matrix" },
        matrix(subjects, cols, grants, when ? (g) => !current.has(key(g)) : null)),
      detail);
    // Tests and tools wait on this for a view drawn without a page load (time control, grants).
    view.dataset.shown = when ? when.toISOString() : "now";
  };

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
    history.pushState(null, "", hashOf(project, at, extra));
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
