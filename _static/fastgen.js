// The chapters' pandas tables name their columns like ms_per_step_q1: let a header break after each
// underscore, so a table is as wide as its numbers, not as its longest column names.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".cell_output table.dataframe th").forEach((th) => {
    if (th.children.length === 0 && th.textContent.includes("_")) {
      const parts = th.textContent.split("_");
      th.textContent = "";
      parts.forEach((part, i) => {
        th.append(part + (i < parts.length - 1 ? "_" : ""));
        if (i < parts.length - 1) th.append(document.createElement("wbr"));
      });
    }
  });
});
