package schemas

// RecordType tells the two wire records apart.
type RecordType uint8

const (
	TypeStep RecordType = iota + 1
	TypeTrajectory
)

// Step is one LLM call of an agent, decoded from a "step" record.
//
// Slices and byte fields may alias a decoder's reusable buffers; see the
// decoder's documentation for how long they stay valid. Optional fields
// carry a Has* flag, or are nil when absent.
type Step struct {
	StepID        string
	TaskID        string
	GroupID       string // as sent; empty when the record did not set it
	Role          string
	TrajectoryID  string
	StepIndex     int64
	PolicyVersion int64

	// PromptIDs is the whole prompt; nil when the record sent it as
	// PromptDeltaIDs after the prompt and response of ParentStepID (an
	// earlier step of the trajectory), until transform resolves it.
	PromptIDs        []int32
	PromptDeltaIDs   []int32
	ParentStepID     string
	ResponseIDs      []int32
	ResponseLogprobs []float32
	TokenVersions    []int64   // nil when absent
	TeacherLogprobs  []float32 // nil when absent
	HasTokenVersions bool
	HasTeacher       bool

	Messages []byte // raw JSON array text, nil when absent
	// MessagesAdded is the JSON array text of the messages after
	// ParentStepID's, sent instead of Messages; transform resolves it.
	MessagesAdded []byte
	Metadata      []byte // raw JSON object text, nil when absent

	Reward       float64
	HasReward    bool
	Done         bool
	HasDone      bool
	FinishReason string
	Model        string
	CreatedAt    int64 // microseconds since the Unix epoch, UTC
	HasCreatedAt bool
}

// Signal is one named sub-score of a trajectory.
type Signal struct {
	Name  string
	Value float64
}

// Trajectory is one scored agent run, decoded from a "trajectory" record.
type Trajectory struct {
	TrajectoryID      string
	TaskID            string
	GroupID           string // as sent; empty when the record did not set it
	Role              string
	Reward            float64
	NumSteps          int64
	TerminationReason string
	Signals           []Signal // nil when absent
	HasSignals        bool
	IsCorrect         bool
	HasIsCorrect      bool
	GroupSize         int64 // 0 when absent
	// RejectedSteps counts the trajectory's steps its producer wrote
	// knowing they would be dead-lettered (the gateway's null logprobs):
	// a trajectory with any can never complete.
	RejectedSteps int64
	Metadata      []byte
}

// GroupKey returns the advantage group of a record: group_id when set,
// otherwise task_id, or task_id:role when role is set.
func GroupKey(groupID, taskID, role string) string {
	if groupID != "" {
		return groupID
	}
	if role != "" {
		return taskID + ":" + role
	}
	return taskID
}

// Key returns the step's advantage group.
func (s *Step) Key() string { return GroupKey(s.GroupID, s.TaskID, s.Role) }

// OldestVersion is the policy version of the step's oldest token: the
// smallest of its token_versions and its policy_version. Staleness is
// judged on it (a generation that spanned a weight update is as stale as
// its first tokens).
func (s *Step) OldestVersion() int64 {
	v := s.PolicyVersion
	for _, t := range s.TokenVersions {
		v = min(v, t)
	}
	return v
}

// MixedVersions reports whether the step's tokens span policy versions:
// token_versions present and not all equal to policy_version. Uniform ones
// say nothing the step's version does not, and are stored as absent.
func (s *Step) MixedVersions() bool {
	for _, t := range s.TokenVersions {
		if t != s.PolicyVersion {
			return true
		}
	}
	return false
}

// Key returns the trajectory's advantage group.
func (t *Trajectory) Key() string { return GroupKey(t.GroupID, t.TaskID, t.Role) }
