// HMM mode: whether devices may address ordinary (pageable, unregistered) host memory, as on
// systems with heterogeneous memory management or address translation services (e.g. Grace
// Hopper), where a kernel or copy may be handed a malloc'd pointer. tide's CPU mode turns it on
// so that CPU tensors can stand for the model's device memory (TIDE_STANDIN_HMM,
// tide_standin_set_hmm). Off by default: then only device allocations and mapped VMM ranges are
// device memory, as on a discrete GPU without HMM.
#pragma once

namespace tide::standin {

void set_host_addressable(bool on);
bool host_addressable();

}  // namespace tide::standin
