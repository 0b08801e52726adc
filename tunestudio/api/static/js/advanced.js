// The form's Advanced section: every JobConfig field the main form does not show, in the groups the server
// names (GET /api/web/defaults `groups`, config.FIELD_GROUPS: their order and titles), each field under the
// group its own metadata gives (config/parts.py). A field with no group, or one the list lacks, falls under
// "other", so a new JobConfig field is never hidden from the page.

import {el} from "./util.js";

/** The <details> of the fields in `rest`, a fieldset per group; make(name) builds a field's box. */
export function advancedSection(rest, groups, make) {
  const known = new Set(groups.map(([key]) => key));
  const groupOf = (f) => (known.has(f.group) ? f.group : "other");
  return el("details", {class: "advanced", id: "advanced"},
    el("summary", {}, `Advanced (${rest.length} more settings)`),
    groups.map(([key, title]) => {
      const members = rest.filter((f) => groupOf(f) === key);
      return members.length ? el("fieldset", {class: "group", "data-group": key},
        el("legend", {}, title), el("div", {class: "grid"}, members.map((f) => make(f.name)))) : null;
    }));
}
