package config

import (
	"sort"
	"strings"

	"github.com/idemd/idemd/pipeline"
)

// Resources are the broker resources a pipelines file names, by broker: what the daemon
// needs clients for, what `idemd check` looks for, and what `idemd dev` creates in its
// fakes.
type Resources struct {
	// KafkaSubscriptions reports a subscription on Kafka topics; KafkaTopics are every
	// Kafka topic named (Topics).
	KafkaSubscriptions bool
	KafkaTopics        []string
	// PubSubSubscriptions are the Pub/Sub subscriptions, each as the pipelines file names
	// it (with its project when given).
	PubSubSubscriptions []PubSubName
	// PubSubTopics are the Pub/Sub publish targets' topics.
	PubSubTopics []string
	// SQSSubscriptions and SQSTargets are the queues consumed and published to (names or
	// URLs).
	SQSSubscriptions, SQSTargets []string
	// kafkaTargets reports a publish target or a dead-letter topic on Kafka.
	kafkaTargets bool
}

// KafkaTargets reports whether the relay needs Kafka: the pipelines publish to a Kafka topic
// (a target or a dead-letter topic).
func (r *Resources) KafkaTargets() bool { return r.kafkaTargets }

// BrokerTargets reports whether the pipelines publish to a broker (Kafka, Pub/Sub or SQS):
// then their outbox rows need a relay. HTTP targets have their own deliverer.
func (r *Resources) BrokerTargets() bool {
	return r.kafkaTargets || len(r.PubSubTopics)+len(r.SQSTargets) > 0
}

// PubSubName is a Pub/Sub subscription as a pipeline names it.
type PubSubName struct {
	// Pipeline is the subscription's pipeline.
	Pipeline string
	// Name is an id or a full name (projects/P/subscriptions/S); Project, when set, is
	// the project of an id.
	Name, Project string
}

// ProjectOf returns the project named in a full resource name (projects/P/…), or "".
func ProjectOf(name string) string {
	rest, ok := strings.CutPrefix(name, "projects/")
	if !ok {
		return ""
	}
	project, _, _ := strings.Cut(rest, "/")
	return project
}

// Resources lists the broker resources f names.
func (f *File) Resources() Resources {
	r := Resources{KafkaTopics: f.Topics()}
	topics, queues := map[string]bool{}, map[string]bool{}
	add := func(ts pipeline.Targets) {
		for _, t := range ts {
			if t.Topic != "" {
				r.kafkaTargets = true
			}
			if t.PubSub != nil {
				topics[t.PubSub.Topic] = true
			}
			if t.SQS != nil {
				queues[t.SQS.Queue] = true
			}
		}
	}
	for _, s := range f.Sources {
		add(s.Publish)
	}
	for _, s := range f.Subscriptions {
		add(s.Publish)
		if s.DeadLetter.Topic != "" {
			r.kafkaTargets = true
		}
		switch {
		case s.PubSub != nil:
			r.PubSubSubscriptions = append(r.PubSubSubscriptions, PubSubName{Pipeline: s.Name, Name: s.PubSub.Subscription, Project: s.PubSub.Project})
		case s.SQS != nil:
			r.SQSSubscriptions = append(r.SQSSubscriptions, s.SQS.Queue)
		default:
			r.KafkaSubscriptions = true
		}
	}
	r.PubSubTopics, r.SQSTargets = sorted(topics), sorted(queues)
	return r
}

// UsesPubSub and UsesSQS report whether the pipelines name that broker at all.
func (r *Resources) UsesPubSub() bool {
	return len(r.PubSubSubscriptions)+len(r.PubSubTopics) > 0
}

// UsesSQS reports whether the pipelines name an SQS queue.
func (r *Resources) UsesSQS() bool { return len(r.SQSSubscriptions)+len(r.SQSTargets) > 0 }

func sorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
