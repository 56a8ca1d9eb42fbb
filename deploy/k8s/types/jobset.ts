// JobSet v1alpha2 (jobset.x-k8s.io), written from the Go API types of
// kubernetes-sigs/jobset (api/jobset/v1alpha2/jobset_types.go) for check.py:
// the spec's fields, with their JSON names, optionality and enums, and the
// Job template as kubernetes-types' batch/v1 JobTemplateSpec, so the pod
// templates inside are checked as strictly as a StatefulSet's. Status is
// left out (never written in a manifest). Every field of JobSetSpec is
// here, so a misspelled one fails the excess-property check.
import type { JobTemplateSpec } from "kubernetes-types/batch/v1";
import type { ObjectMeta } from "kubernetes-types/meta/v1";
import type { PersistentVolumeClaim } from "kubernetes-types/core/v1";

export interface JobSet {
  apiVersion?: "jobset.x-k8s.io/v1alpha2";
  kind?: "JobSet";
  metadata?: ObjectMeta;
  spec?: JobSetSpec;
}

export interface JobSetSpec {
  replicatedJobs?: Array<ReplicatedJob>;
  network?: Network;
  successPolicy?: SuccessPolicy;
  failurePolicy?: FailurePolicy;
  /** Deprecated upstream in favour of dependsOn; mutually exclusive with it. */
  startupPolicy?: StartupPolicy;
  suspend?: boolean;
  coordinator?: Coordinator;
  managedBy?: string;
  ttlSecondsAfterFinished?: number;
  volumeClaimPolicies?: Array<VolumeClaimPolicy>;
}

export interface ReplicatedJob {
  name: string;
  groupName?: string;
  template: JobTemplateSpec;
  replicas?: number;
  dependsOn?: Array<DependsOn>;
}

export interface DependsOn {
  name: string;
  status: "Ready" | "Complete";
}

export interface Network {
  enableDNSHostnames?: boolean;
  subdomain?: string;
  publishNotReadyAddresses?: boolean;
}

export type Operator = "All" | "Any";

export interface SuccessPolicy {
  operator: Operator;
  targetReplicatedJobs?: Array<string>;
}

export type FailurePolicyAction =
  | "FailJobSet"
  | "RestartJobSet"
  | "RestartJobSetAndIgnoreMaxRestarts"
  | "RestartJob"
  | "RestartJobAndIgnoreMaxRestarts";

export interface FailurePolicyRule {
  name: string;
  action: FailurePolicyAction;
  onJobFailureReasons?: Array<string>;
  onJobFailureMessagePatterns?: Array<string>;
  targetReplicatedJobs?: Array<string>;
}

export interface FailurePolicy {
  maxRestarts?: number;
  restartStrategy?: "Recreate" | "BlockingRecreate" | "InPlaceRestart";
  rules?: Array<FailurePolicyRule>;
}

export interface StartupPolicy {
  startupPolicyOrder: "AnyOrder" | "InOrder";
}

export interface Coordinator {
  replicatedJob: string;
  jobIndex?: number;
  podIndex?: number;
}

export interface VolumeClaimPolicy {
  templates?: Array<PersistentVolumeClaim>;
  retentionPolicy?: { whenDeleted?: "Delete" | "Retain" };
}
