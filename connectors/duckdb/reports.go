package duckdb

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrUnknownReport is returned by Report for a name not in Reports.
var ErrUnknownReport = errors.New("unknown report")

// ReportOptions parametrise the reports.
type ReportOptions struct {
	// K lists the k of pass@k (positive, in the order given, duplicates
	// dropped). Default 1, 2, 4, 8.
	K []int
}

// ReportInfo names a report and says what it answers.
type ReportInfo struct {
	Name, Doc string
}

// Report names.
const (
	ReportRewardByVersion = "reward-by-version"
	ReportPassAtK         = "pass-at-k"
	ReportStaleness       = "staleness"
	ReportTokenLengths    = "token-lengths"
	ReportAdvantage       = "advantage"
	ReportDeadLetters     = "dead-letters"
	// ReportDeadLettersOverTime counts dead letters by reason per commit.
	ReportDeadLettersOverTime = "dead-letters-over-time"
	// The reports below feed the charts of `rllm-pipe report` and `ui`.
	ReportPassAtKByVersion   = "pass-at-k-by-version"
	ReportLengthsByVersion   = "token-lengths-by-version"
	ReportAdvantageHistogram = "advantage-histogram"
	ReportFilteredByVersion  = "filtered-by-version"
	ReportFilteredOverTime   = "filtered-over-time"
	ReportThroughput         = "throughput"
	ReportRoles              = "roles"
	ReportTrainingLoop       = "training-loop"
	ReportStaleSkips         = "stale-skips"
	ReportPromptForks        = "prompt-forks"
)

// AdvantageBins is the number of bins of the advantage-histogram report.
const AdvantageBins = 30

// Reports lists the named reports in a stable order.
func Reports() []ReportInfo {
	return []ReportInfo{
		{ReportRewardByVersion, "per group_version: groups, trajectories, mean reward (over trajectories), pass rate (passing trajectories / trajectories)"},
		{ReportPassAtK, "per task: n trajectories, c passing, unbiased pass@k = 1 - C(n-c,k)/C(n,k) for each --k (null when k > n); last row the mean over tasks"},
		{ReportStaleness, "groups by staleness: newest group_version committed at or before the group's shard (manifest order) minus the group's group_version"},
		{ReportTokenLengths, "prompt and response tokens per step: steps, mean, quantiles p50/p90/p99 (quantile_cont: linear interpolation), min, max"},
		{ReportAdvantage, "per estimator, over trajectories: count, mean (to 12 decimals), std (population), min, p01, p50, p99 (quantile_cont), max, fraction exactly zero"},
		{ReportDeadLetters, "committed dead letters by reason code, with their share"},
		{ReportDeadLettersOverTime, "per manifest entry that committed dead letters, in commit-time order (ties by seq), and every reason seen: committed_at, the entry's dead letters of that reason (0 if none), and the cumulative dead letters of that reason"},
		{ReportPassAtKByVersion, "per group_version: tasks, then per --k the mean over its tasks of the unbiased pass@k of pass-at-k (tasks with k > n left out)"},
		{ReportLengthsByVersion, "per group_version: steps, prompt and response tokens per step: mean and p90 (quantile_cont)"},
		{ReportAdvantageHistogram, "per estimator, trajectories by advantage in 30 equal bins between the min and max over all trajectories (bin, bin_lo, bin_hi; empty bins left out)"},
		{ReportFilteredByVersion, "per group_version and filter reason ('(kept)' for trajectories not filtered): groups with a trajectory of that reason (a trajectory marked by several filters, stored as 'a,b', counts under each)"},
		{ReportFilteredOverTime, "per committed shard in commit-time order (ties by seq) and filter reason (split as in filtered-by-version): committed_at, the shard's groups, and the cumulative groups of that reason"},
		{ReportThroughput, "per committed shard in commit-time order (ties by seq; shards commit concurrently, so seq order is not time order): committed_at, rows, groups, cumulative rows, and rows per second since the previous commit"},
		{ReportRoles, "per role ('(none)' when unset): trajectories, mean reward, pass rate, mean response tokens per trajectory"},
		{ReportTrainingLoop, "per consumer group and train step (acknowledged batch): policy version, groups, largest staleness, and how long after their last trajectory finished at the capture gateway (trajectory metadata finished_at) the groups were acknowledged, p50 and max in seconds (null for groups without it)"},
		{ReportStaleSkips, "per consumer group and policy version with groups skipped as stale (stale_skips): groups committed, acknowledged and skipped as stale, and the share skipped"},
		{ReportPromptForks, "trajectories by their number of prompt forks (prompt_forks: steps whose prompt does not extend the previous step's prompt + response): forks, trajectories, their steps, and the mean first token where the forks diverge"},
	}
}

// Report returns the query of the named report. Reports read the views
// only, so they run in the DuckDB CLI over the statements of ViewsSQL too.
func Report(name string, o ReportOptions) (string, error) {
	switch name {
	case ReportRewardByVersion:
		return rewardByVersionSQL, nil
	case ReportPassAtK:
		ks, err := passKs(o.K)
		if err != nil {
			return "", err
		}
		return passAtKSQL(ks), nil
	case ReportStaleness:
		return stalenessSQL, nil
	case ReportTokenLengths:
		return tokenLengthsSQL, nil
	case ReportAdvantage:
		return advantageSQL, nil
	case ReportDeadLetters:
		return deadLettersReportSQL, nil
	case ReportDeadLettersOverTime:
		return deadLettersOverTimeSQL, nil
	case ReportPassAtKByVersion:
		ks, err := passKs(o.K)
		if err != nil {
			return "", err
		}
		return passAtKByVersionSQL(ks), nil
	case ReportLengthsByVersion:
		return lengthsByVersionSQL, nil
	case ReportAdvantageHistogram:
		return advantageHistogramSQL, nil
	case ReportFilteredByVersion:
		return filteredByVersionSQL, nil
	case ReportFilteredOverTime:
		return filteredOverTimeSQL, nil
	case ReportThroughput:
		return throughputSQL, nil
	case ReportRoles:
		return rolesSQL, nil
	case ReportTrainingLoop:
		return trainingLoopSQL, nil
	case ReportStaleSkips:
		return staleSkipsSQL, nil
	case ReportPromptForks:
		return promptForksReportSQL, nil
	}
	var names []string
	for _, r := range Reports() {
		names = append(names, r.Name)
	}
	sort.Strings(names)
	return "", fmt.Errorf("%w %q (reports: %s)", ErrUnknownReport, name, strings.Join(names, ", "))
}

const promptForksReportSQL = `WITH per_traj AS (
  SELECT t.group_id, t.group_version, t.trajectory_id, t.steps, count(f.step_id) AS forks, avg(f.fork_at) AS fork_at
  FROM trajectories t LEFT JOIN prompt_forks f USING (group_id, group_version, trajectory_id)
  GROUP BY ALL
)
SELECT forks, count(*) AS trajectories, sum(steps) AS steps, round(avg(fork_at), 2) AS mean_fork_at
FROM per_traj GROUP BY forks ORDER BY forks`

const staleSkipsSQL = `WITH committed AS (
  SELECT group_version AS policy_version, count(*) AS groups FROM groups GROUP BY ALL
), acked AS (
  SELECT consumer_group, group_version AS policy_version, count(*) AS groups FROM consumed GROUP BY ALL
)
SELECT s.consumer_group, s.policy_version, coalesce(c.groups, 0) AS groups_committed, coalesce(a.groups, 0) AS groups_acked,
  s.groups AS groups_skipped_stale, round(s.groups / nullif(c.groups, 0), 4) AS share_skipped
FROM stale_skips s
LEFT JOIN committed c USING (policy_version)
LEFT JOIN acked a USING (consumer_group, policy_version)
ORDER BY s.consumer_group, s.policy_version`

const trainingLoopSQL = `WITH finished AS (
  SELECT group_id, max(TRY_CAST(json_extract_string(trajectory_metadata, '$.finished_at') AS TIMESTAMPTZ)) AS finished_at
  FROM stored_steps
  WHERE step_index = 0
  GROUP BY group_id
), aged AS (
  SELECT c.consumer_group, c.train_step, c.policy_version, c.group_id, c.staleness,
    epoch(c.acked_at) - epoch(f.finished_at) AS age_s
  FROM consumed c LEFT JOIN finished f USING (group_id)
)
SELECT consumer_group, train_step, max(policy_version) AS policy_version, count(*) AS groups, max(staleness) AS staleness_max,
  quantile_cont(age_s, 0.5) AS ack_age_p50_s, max(age_s) AS ack_age_max_s
FROM aged
GROUP BY consumer_group, train_step
ORDER BY consumer_group, train_step`

const rewardByVersionSQL = `SELECT group_version,
  count(DISTINCT group_id) AS groups,
  count(*) AS trajectories,
  avg(reward) AS mean_reward,
  avg(CASE WHEN pass THEN 1.0::DOUBLE ELSE 0.0::DOUBLE END) AS pass_rate
FROM trajectories
GROUP BY group_version
ORDER BY group_version`

func passKs(in []int) ([]int, error) {
	if len(in) == 0 {
		return []int{1, 2, 4, 8}, nil
	}
	seen := map[int]bool{}
	var ks []int
	for _, k := range in {
		if k <= 0 {
			return nil, fmt.Errorf("pass@k: k must be positive, not %d", k)
		}
		if !seen[k] {
			seen[k] = true
			ks = append(ks, k)
		}
	}
	return ks, nil
}

// passAtKSQL is the unbiased estimator of Chen et al. (2021), in its
// numerically stable product form:
//
//	pass@k = 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i)
//
// 1 when n - c < k (every k-subset holds a pass), 0 when c = 0, null
// when k > n (no k-subset exists). The mean row averages over the tasks
// where pass@k is defined.
func passAtKSQL(ks []int) string {
	var per, mean, cols []string
	for _, k := range ks {
		col := fmt.Sprintf(`"pass@%d"`, k)
		kk := itoa(k)
		per = append(per, fmt.Sprintf(`  CASE WHEN %[1]s > n THEN NULL::DOUBLE WHEN c = 0 THEN 0::DOUBLE WHEN n - c < %[1]s THEN 1::DOUBLE
    ELSE 1::DOUBLE - list_product(list_transform(range(n - c + 1, n + 1), i -> 1::DOUBLE - %[1]s::DOUBLE / i)) END AS %[2]s`, kk, col))
		mean = append(mean, fmt.Sprintf("avg(%[1]s) AS %[1]s", col))
		cols = append(cols, col)
	}
	return `WITH per_task AS (
  SELECT task_id, count(*) AS n, count(*) FILTER (WHERE pass) AS c
  FROM trajectories
  GROUP BY task_id
), estimates AS (
  SELECT task_id, n, c,
` + strings.Join(per, ",\n") + `
  FROM per_task
)
SELECT task_id, n, c, ` + strings.Join(cols, ", ") + `
FROM (
  SELECT 0 AS part, * FROM estimates
  UNION ALL
  SELECT 1, '(mean)', NULL::BIGINT, NULL::BIGINT, ` + strings.Join(mean, ", ") + ` FROM estimates
)
ORDER BY part, task_id`
}

// GroupStalenessSQL is every group's staleness (group_id,
// group_version, staleness): a shard's newest version is the running
// maximum of group_version over the shards committed up to it (manifest
// order; the shards of one record of an object-store manifest, a group
// commit, landed at once and count together); a group's staleness is
// that, at its shard, minus its own
// group_version: how many versions behind the newest policy it was when
// it landed. The staleness report counts its rows.
var GroupStalenessSQL = GroupStalenessOver("groups")

// GroupStalenessOver is GroupStalenessSQL over another relation of groups
// (group_id, group_version, shard), as the live view's trajectory
// browser runs it over the trajectories it has read once, so that a
// staleness bucket links to its groups.
func GroupStalenessOver(groups string) string {
	return `WITH shard_version AS (
  SELECT s.seq, s.path, max(g.group_version) AS version
  FROM shards s LEFT JOIN ` + groups + ` g ON g.shard = s.path
  GROUP BY s.seq, s.path
), newest AS (
  SELECT path, max(version) OVER (ORDER BY seq RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS newest
  FROM shard_version
)
SELECT g.group_id, g.group_version, n.newest - g.group_version AS staleness
FROM ` + groups + ` g JOIN newest n ON n.path = g.shard`
}

var stalenessSQL = `WITH staleness AS (
` + GroupStalenessSQL + `
)
SELECT staleness, count(*) AS groups, count(*) / sum(count(*)) OVER () AS share
FROM staleness
GROUP BY staleness
ORDER BY staleness`

const tokenLengthsSQL = `SELECT tokens, count(*) AS steps, avg(len) AS mean,
  quantile_cont(len, 0.5) AS p50, quantile_cont(len, 0.9) AS p90, quantile_cont(len, 0.99) AS p99,
  min(len) AS min, max(len) AS max
FROM (
  SELECT 'prompt' AS tokens, 0 AS o, prompt_tokens AS len FROM stored_steps
  UNION ALL
  SELECT 'response', 1, response_tokens FROM stored_steps
)
GROUP BY tokens, o
ORDER BY o`

// advantageSQL rounds the mean to 12 decimals: the group estimators'
// means are 0 up to the summation's rounding (3.8e-17 in one run, -1.2e-17
// in the next, as the parallel sum's order varies), shown as 0, and the
// same in every run. Adding 0.0 turns a -0 into 0.
const advantageSQL = `SELECT estimator, count(*) AS trajectories, round(avg(advantage), 12) + 0.0 AS mean, stddev_pop(advantage) AS std,
  min(advantage) AS min, quantile_cont(advantage, 0.01) AS p01, quantile_cont(advantage, 0.5) AS p50,
  quantile_cont(advantage, 0.99) AS p99, max(advantage) AS max,
  avg(CASE WHEN advantage = 0 THEN 1.0::DOUBLE ELSE 0.0::DOUBLE END) AS zero_fraction
FROM trajectories
GROUP BY estimator
ORDER BY estimator`

const deadLettersReportSQL = `SELECT reason, count(*) AS dead_letters, count(*) / sum(count(*)) OVER () AS share
FROM dead_letters
GROUP BY reason
ORDER BY dead_letters DESC, reason`

// deadLettersOverTimeSQL gives every reason a row at every entry that
// committed dead letters (0 when it committed none of that reason), so
// each reason's cumulative line spans the same commits.
const deadLettersOverTimeSQL = `WITH per_commit AS (
  SELECT seq, committed_at, reason, sum(dead_letters)::BIGINT AS dead_letters
  FROM dead_letter_commits
  GROUP BY seq, committed_at, reason
), commits AS (
  SELECT DISTINCT seq, committed_at FROM per_commit
), reasons AS (
  SELECT DISTINCT reason FROM per_commit
), filled AS (
  SELECT c.seq, c.committed_at, r.reason, coalesce(p.dead_letters, 0)::BIGINT AS dead_letters
  FROM commits c CROSS JOIN reasons r
  LEFT JOIN per_commit p ON p.seq = c.seq AND p.committed_at IS NOT DISTINCT FROM c.committed_at AND p.reason IS NOT DISTINCT FROM r.reason
)
SELECT seq, committed_at, reason, dead_letters,
  sum(dead_letters) OVER (PARTITION BY reason ORDER BY committed_at, seq ROWS UNBOUNDED PRECEDING)::BIGINT AS cumulative_dead_letters
FROM filled
ORDER BY committed_at, seq, reason`

// passAtKByVersionSQL is pass-at-k's estimator per (group_version,
// task_id), averaged per group_version over the tasks where it is defined.
func passAtKByVersionSQL(ks []int) string {
	var per, mean []string
	for _, k := range ks {
		col := fmt.Sprintf(`"pass@%d"`, k)
		kk := itoa(k)
		per = append(per, fmt.Sprintf(`  CASE WHEN %[1]s > n THEN NULL::DOUBLE WHEN c = 0 THEN 0::DOUBLE WHEN n - c < %[1]s THEN 1::DOUBLE
    ELSE 1::DOUBLE - list_product(list_transform(range(n - c + 1, n + 1), i -> 1::DOUBLE - %[1]s::DOUBLE / i)) END AS %[2]s`, kk, col))
		mean = append(mean, fmt.Sprintf("avg(%[1]s) AS %[1]s", col))
	}
	return `WITH per_task AS (
  SELECT group_version, task_id, count(*) AS n, count(*) FILTER (WHERE pass) AS c
  FROM trajectories
  GROUP BY group_version, task_id
), estimates AS (
  SELECT group_version, task_id,
` + strings.Join(per, ",\n") + `
  FROM per_task
)
SELECT group_version, count(*) AS tasks, ` + strings.Join(mean, ", ") + `
FROM estimates
GROUP BY group_version
ORDER BY group_version`
}

const lengthsByVersionSQL = `SELECT group_version, count(*) AS steps,
  avg(prompt_tokens) AS prompt_mean, quantile_cont(prompt_tokens, 0.9) AS prompt_p90,
  avg(response_tokens) AS response_mean, quantile_cont(response_tokens, 0.9) AS response_p90
FROM stored_steps
GROUP BY group_version
ORDER BY group_version`

// AdvantageBinsSQL is every trajectory with a finite advantage and its
// bin of the advantage-histogram report (group_id, group_version,
// trajectory_id, estimator, advantage, bin, and the range lo to hi the
// 30 bins split): the report counts its rows.
var AdvantageBinsSQL = AdvantageBinsOver("trajectories")

// AdvantageBinsOver is AdvantageBinsSQL over another relation of
// trajectories, as the live view's trajectory browser runs it over the
// trajectories it has read once, so that a bin links to its
// trajectories.
func AdvantageBinsOver(trajectories string) string {
	return `WITH a AS (
  SELECT group_id, group_version, trajectory_id, estimator, advantage FROM ` + trajectories + ` WHERE isfinite(advantage)
), r AS (
  SELECT min(advantage) AS lo, max(advantage) AS hi FROM a
)
SELECT group_id, group_version, trajectory_id, estimator, advantage, CASE WHEN r.hi = r.lo THEN 0
    ELSE least(floor((advantage - r.lo) / (r.hi - r.lo) * 30), 29)::INTEGER END AS bin, r.lo, r.hi
FROM a, r`
}

var advantageHistogramSQL = `WITH binned AS (
` + AdvantageBinsSQL + `
)
SELECT estimator, bin,
  lo + (hi - lo) * bin / 30.0 AS bin_lo,
  CASE WHEN hi = lo THEN hi ELSE lo + (hi - lo) * (bin + 1) / 30.0 END AS bin_hi,
  count(*) AS trajectories
FROM binned
GROUP BY estimator, bin, lo, hi
ORDER BY estimator, bin`

// trajectoryReasonsSQL is every trajectory once per filter reason it
// carries: a trajectory two filters marked is stored with the reasons
// comma-joined ("zero_variance,truncated") and counts under each, never
// as a reason of its own; one no filter marked is "(kept)".
const trajectoryReasonsSQL = `SELECT shard, group_id, group_version,
    unnest(CASE WHEN coalesce(filter_reason, '') = '' THEN ['(kept)'] ELSE string_split(filter_reason, ',') END) AS filter_reason
  FROM trajectories`

// filteredByVersionSQL counts a group under every reason one of its
// trajectories carries.
const filteredByVersionSQL = `WITH reasons AS (
  ` + trajectoryReasonsSQL + `
)
SELECT group_version, filter_reason, count(DISTINCT group_id) AS "groups"
FROM reasons
GROUP BY 1, 2
ORDER BY group_version, filter_reason`

// filteredOverTimeSQL counts a group under every reason one of its
// trajectories carries, as filtered-by-version does.
const filteredOverTimeSQL = `WITH reasons AS (
  ` + trajectoryReasonsSQL + `
), per_group AS (
  SELECT DISTINCT shard, group_id, group_version, filter_reason FROM reasons
), per_shard AS (
  SELECT shard, filter_reason, count(*) AS "groups" FROM per_group GROUP BY shard, filter_reason
)
SELECT s.seq, s.committed_at, p.filter_reason, p."groups",
  sum(p."groups") OVER (PARTITION BY p.filter_reason ORDER BY s.committed_at, s.seq ROWS UNBOUNDED PRECEDING)::BIGINT AS cumulative_groups
FROM per_shard p JOIN shards s ON s.path = p.shard
ORDER BY s.committed_at, s.seq, p.filter_reason`

// throughputSQL follows commit time: shard commits run concurrently, so
// a later seq may carry an earlier committed_at, and cumulative rows in
// seq order would go back in time.
const throughputSQL = `SELECT seq, committed_at, "rows", "groups",
  sum("rows") OVER (ORDER BY committed_at, seq ROWS UNBOUNDED PRECEDING)::BIGINT AS cumulative_rows,
  "rows" / nullif(epoch(committed_at) - epoch(lag(committed_at) OVER (ORDER BY committed_at, seq)), 0) AS rows_per_second
FROM shards
ORDER BY committed_at, seq`

const rolesSQL = `SELECT coalesce(role, '(none)') AS role, count(*) AS trajectories, avg(reward) AS mean_reward,
  avg(CASE WHEN pass THEN 1.0::DOUBLE ELSE 0.0::DOUBLE END) AS pass_rate,
  avg(response_tokens) AS mean_response_tokens
FROM trajectories
GROUP BY 1
ORDER BY 1`
