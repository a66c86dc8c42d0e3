/// @file
/// Where this process sits in the job, read from the variables the common
/// launchers set: torchrun / zero-run (RANK, WORLD_SIZE, ...), mpirun
/// (OMPI_COMM_WORLD_*) and srun (SLURM_*). No torch here.
#pragma once

#include <functional>
#include <string>

namespace zero::comm {

/// This process's place in the job, as its launcher described it.
struct LaunchEnv {
  std::string launcher;  ///< "torchrun", "mpirun", "srun" or "none" (single process)
  int rank = 0;  ///< RANK (or OMPI_COMM_WORLD_RANK, SLURM_PROCID)
  int world_size = 1;  ///< WORLD_SIZE (or OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)
  int local_rank = 0;  ///< LOCAL_RANK: the rank among this host's ranks
  int local_world_size = 1;  ///< 0: the launcher did not say
  std::string master_addr;  ///< empty for a single process without a launcher
  int master_port = 0;  ///< MASTER_PORT: the rendezvous port (0 for a single process)
  /// Identifies this job (e.g. for naming shared-memory segments); from
  /// ZERO_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID or the master address/port.
  std::string job_id;
};

/// Looks up one environment variable (getenv, or a test's table).
using GetEnv = std::function<const char*(const char*)>;

/// Throws std::runtime_error naming the missing or inconsistent variable.
LaunchEnv read_launch_env(const GetEnv& getenv);
LaunchEnv read_launch_env();  ///< from the process environment

/// The name prefix of this job's shared-memory segments ("zero-" + the job
/// id made file-name safe); zero-run removes files with it after the job.
std::string shm_segment_prefix(const std::string& job_id);

/// zero-run's note channel. Each rank zero-run starts gets ZERO_RUN_NOTE_FD,
/// the write end of a pipe its agent reads when the rank exits. A rank whose
/// collective failed because a peer went away (its connection closed or was
/// reset, its process exited: CommError notes it, whatever the program then
/// does) writes kPeerLostNote and the error there, so that the agent takes its
/// exit for a consequence of another rank's failure, not for the failure
/// (apps/zero_run.cpp: it waits a little for the failing rank to be named).
constexpr const char* kRunNoteFdVariable = "ZERO_RUN_NOTE_FD";  ///< (see above)
constexpr const char* kPeerLostNote = "peer-lost ";  ///< (see above)
/// Whether a collective's error says that a peer went away.
bool says_peer_lost(const std::string& error);
/// Writes kPeerLostNote + the first line of `error` + "\n" to ZERO_RUN_NOTE_FD,
/// the first time only; nothing without that variable.
void note_peer_lost(const std::string& error);

}  // namespace zero::comm
