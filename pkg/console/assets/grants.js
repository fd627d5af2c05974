import { h, replace } from "./dom.js";
import { rbac } from "./api.js";

// Subjects, rules and the grant / revoke flow shared by the Access and Projects pages. A grant
// or a revoke is first asked of the server as a dry run (the same validation and authorization
// as the write, nothing written); the answer's plan is what the confirmation shows, and only a
// confirmed question makes the write.

const KIND = { SUBJECT_KIND_USER: "User", SUBJECT_KIND_GROUP: "Group", SUBJECT_KIND_SERVICE_ACCOUNT: "ServiceAccount" };
const TOKEN = { SUBJECT_KIND_USER: "user", SUBJECT_KIND_GROUP: "group", SUBJECT_KIND_SERVICE_ACCOUNT: "serviceaccount" };
const ACTION = { CHANGE_ACTION_CREATE: "created", CHANGE_ACTION_UPDATE: "updated", CHANGE_ACTION_DELETE: "deleted" };

// subjectID is the server's identity of a subject (kind:name, kind:namespace:name): the key of
// a matrix row and the form a subject takes in a link.
export function subjectID(s) {
  return `${TOKEN[s.kind] || "?"}:${s.namespace ? s.namespace + ":" : ""}${s.name}`;
}

export function subjectText(s) {
  return `${KIND[s.kind] || "?"} ${s.namespace ? s.namespace + "/" : ""}${s.name}`;
}

// parseSubject reads user:<name>, group:<name> or serviceaccount:<namespace>:<name> (a user or
// group name may itself hold colons: oidc:alice). It returns null for anything else.
export function parseSubject(text) {
  const m = /^(user|group|serviceaccount|sa):(.+)$/i.exec(text.trim());
  if (!m) return null;
  const kind = m[1].toLowerCase();
  if (kind === "user") return { kind: "SUBJECT_KIND_USER", name: m[2] };
  if (kind === "group") return { kind: "SUBJECT_KIND_GROUP", name: m[2] };
  const i = m[2].indexOf(":");
  if (i <= 0 || i === m[2].length - 1) return null;
  return { kind: "SUBJECT_KIND_SERVICE_ACCOUNT", namespace: m[2].slice(0, i), name: m[2].slice(i + 1) };
}

// formatRule writes a PolicyRule as kubectl describe would: verbs, then what they apply to.
export function formatRule(r) {
  const groups = (r.apiGroups || []).map((g) => (g === "" ? "core" : g));
  const parts = [(r.verbs || []).join(", ")];
  if ((r.resources || []).length) parts.push("on " + r.resources.join(", ") + (groups.length ? ` (${groups.join(", ")})` : ""));
  if ((r.resourceNames || []).length) parts.push("named " + r.resourceNames.join(", "));
  if ((r.nonResourceUrls || []).length) parts.push("at " + r.nonResourceUrls.join(", "));
  return parts.join(" ");
}

// rules lists PolicyRules; a long list (a built-in role has eight) is folded under its count.
export function rules(list) {
  if (!(list || []).length) return h("span", { class: "muted" }, "no rules");
  const ul = h("ul", { class: "rules" }, list.map((r) => h("li", {}, formatRule(r))));
  return list.length <= 3 ? ul : h("details", {}, h("summary", {}, `${list.length} rules`), ul);
}

export function templateText(t) {
  return t.displayName ? `${t.name} — ${t.displayName}` : t.name;
}

// confirmDialog is a modal question: ask() shows it with the focus on Cancel and resolves true
// when the user confirms, false on Cancel or Escape.
export function confirmDialog() {
  const title = h("h2", { id: "confirm-h" });
  const text = h("div", { id: "confirm-text" });
  const yes = h("button", { type: "button", id: "confirm-yes" }, "Confirm");
  const no = h("button", { type: "button", id: "confirm-no", class: "secondary" }, "Cancel");
  const el = h("dialog", { id: "confirm", "aria-labelledby": "confirm-h", "aria-describedby": "confirm-text" },
    title, text, h("div", { class: "toolbar" }, yes, no));
  let settle = null;
  const done = (v) => {
    const s = settle;
    settle = null;
    if (el.open) el.close();
    if (s) s(v);
  };
  yes.addEventListener("click", () => done(true));
  no.addEventListener("click", () => done(false));
  // Escape closes the dialog by itself: that is a no.
  el.addEventListener("close", () => done(false));
  return {
    el,
    ask(heading, body, label) {
      replace(title, heading);
      replace(text, body);
      replace(yes, label);
      el.showModal();
      no.focus();
      return new Promise((r) => { settle = r; });
    },
  };
}

// planView shows what a binding change does to the RoleBindings on the clusters.
function planView(plan, project, verb) {
  if (!plan.length) {
    return h("p", { id: "plan-summary" }, `No RoleBinding changes now: ${project} has no namespace on a registered cluster. `,
      verb === "grant" ? "The role applies to every namespace bound to it later." : "");
  }
  const counts = {};
  for (const c of plan) counts[ACTION[c.action] || "changed"] = (counts[ACTION[c.action] || "changed"] || 0) + 1;
  const subjects = (list) => (list || []).length ? (list || []).map(subjectText).join(", ") : "none";
  return [
    h("p", { id: "plan-summary" }, `${plan.length} RoleBinding${plan.length === 1 ? "" : "s"} would change: `,
      Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", "), "."),
    h("table", { id: "plan" },
      h("thead", {}, h("tr", {}, ["Cluster", "Namespace", "RoleBinding", "Change", "Subjects before", "Subjects after"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, plan.map((c) => h("tr", { "data-place": `${c.cluster}/${c.namespace}` },
        h("td", {}, c.cluster), h("td", {}, c.namespace), h("td", {}, c.name),
        h("td", {}, ACTION[c.action] || "changed"),
        h("td", {}, subjects(c.subjectsBefore)), h("td", {}, subjects(c.subjectsAfter)))))),
  ];
}

// grantForm asks the server what granting a template to a subject in project would change,
// shows it, and grants it when confirmed. done() runs after a grant was made. A refusal (the
// caller may not grant, the template is locked, the binding exists) shows in the form.
export function grantForm(project, templates, dialog, done, fail) {
  const kind = h("select", { id: "grant-kind", name: "kind" },
    Object.entries(KIND).map(([k, v]) => h("option", { value: k }, v)));
  const name = h("input", { id: "grant-name", name: "name", required: true, autocomplete: "off", placeholder: "alice or oidc:devs" });
  const ns = h("input", { id: "grant-namespace", name: "namespace", autocomplete: "off", disabled: true });
  const tpl = h("select", { id: "grant-template", name: "template", required: true },
    templates.map((t) => h("option", { value: t.name, disabled: !!t.locked }, templateText(t), t.locked ? " (locked)" : "")));
  const note = h("div", { id: "grant-note", role: "status" });
  kind.addEventListener("change", () => { ns.disabled = kind.value !== "SUBJECT_KIND_SERVICE_ACCOUNT"; });
  const form = h("form", { class: "toolbar", id: "grant-form", "aria-label": `Grant a role in ${project}` },
    h("div", {}, h("label", { for: "grant-kind" }, "Subject kind"), kind),
    h("div", {}, h("label", { for: "grant-name" }, "Subject name"), name),
    h("div", {}, h("label", { for: "grant-namespace" }, "Namespace (ServiceAccount)"), ns),
    h("div", {}, h("label", { for: "grant-template" }, "Role template"), tpl),
    h("button", { type: "submit", id: "grant-preview" }, "Preview grant…"),
    note);
  const error = (e) => { if (!fail(e)) replace(note, h("span", { class: "error", role: "alert", id: "grant-error" }, e.message)); };
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const subject = { kind: kind.value, name: name.value.trim() };
    if (!ns.disabled) subject.namespace = ns.value.trim();
    const t = templates.find((x) => x.name === tpl.value);
    if (!t) {
      replace(note, h("span", { class: "error", role: "alert", id: "grant-error" }, "Pick a role template (none could be listed)."));
      return;
    }
    replace(note, h("span", { class: "muted" }, "Asking the server what would change…"));
    let plan;
    try {
      plan = (await rbac.bind(project, subject, t.name, true)).plan || [];
    } catch (e) {
      error(e);
      return;
    }
    replace(note);
    const ok = await dialog.ask("Grant this role?", [
      h("p", {}, `Grant ${subjectText(subject)} the role ${templateText(t)} in every namespace of project ${project}.`),
      planView(plan, project, "grant"),
      h("p", {}, `${subjectText(subject)} gains there:`), rules(t.effectiveRules),
    ], "Grant");
    if (!ok) return;
    replace(note, h("span", { class: "muted" }, "Granting…"));
    try {
      await rbac.bind(project, subject, t.name, false);
    } catch (e) {
      error(e);
      return;
    }
    replace(note, h("span", { class: "muted", id: "grant-done" }, `Granted ${t.name} to ${subjectText(subject)} in ${project}.`));
    name.value = "";
    done();
  });
  return form;
}

// revoke asks what unbinding would change, confirms, and unbinds. note shows the outcome.
export async function revoke(project, subject, template, dialog, note, done, fail) {
  const error = (e) => { if (!fail(e)) replace(note, h("span", { class: "error", role: "alert", id: "revoke-error" }, e.message)); };
  let plan;
  try {
    plan = (await rbac.unbind(project, subject, template, true)).plan || [];
  } catch (e) {
    error(e);
    return;
  }
  const ok = await dialog.ask("Revoke this role?", [
    h("p", {}, `Revoke the role ${template} from ${subjectText(subject)} in every namespace of project ${project}.`),
    planView(plan, project, "revoke"),
  ], "Revoke");
  if (!ok) return;
  try {
    await rbac.unbind(project, subject, template, false);
  } catch (e) {
    error(e);
    return;
  }
  replace(note, h("span", { class: "muted", id: "revoke-done" }, `Revoked ${template} from ${subjectText(subject)} in ${project}.`));
  done();
}
