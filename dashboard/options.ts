/**
 * The option names `dashboard()` takes, which `serveDashboard()` passes on:
 * one list for both checks of unknown keys.
 *
 * @module
 */

/** The names `DashboardOptions` has. */
export const DASHBOARD_OPTIONS: readonly string[] = [
  "basePath",
  "actions",
  "authorize",
  "origin",
  "refreshMs",
  "title",
  "now",
];
