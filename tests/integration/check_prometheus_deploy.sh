#!/usr/bin/env bash
# Usage: check_prometheus_deploy.sh DEPLOY_PROMETHEUS_DIR
# Validates the Prometheus configuration shipped in deploy/prometheus: the scrape
# config, the rules, and the rules' unit tests. Exit 77 (CTest: skipped) when
# promtool is not installed.
set -euo pipefail

dir="$1"
if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool is not installed (./scripts/setup.sh installs it)"
  exit 77
fi
cd "${dir}"
promtool check config prometheus.yml
promtool check rules depot_rules.yml
promtool test rules depot_rules_test.yml
