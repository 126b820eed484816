// Readiness probe used by scripts/kafka-up.sh.
//
//   java -cp <kafka lib>/*:<classes> KafkaProbe <bootstrap> <timeout-seconds> [broker-pid]
//
// Retries real Admin requests (DescribeCluster + Metadata/ListTopics +
// FindCoordinator/DescribeGroups) until they all succeed or the deadline passes.
// The group request also makes the broker create __consumer_offsets, so the first
// consumer group a test uses does not pay for (or race with) that creation.
// Exit codes: 0 ready, 2 timed out, 3 the broker process (pid) exited.
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterOptions;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeConsumerGroupsOptions;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.errors.GroupIdNotFoundException;

public class KafkaProbe {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: KafkaProbe <bootstrap> <timeout-seconds> [broker-pid]");
            System.exit(64);
        }
        String bootstrap = args[0];
        long deadline = System.nanoTime() + (long) (Double.parseDouble(args[1]) * 1e9);
        long pid = args.length > 2 ? Long.parseLong(args[2]) : -1;

        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "kcr-kafka-probe");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "5000");
        p.put(AdminClientConfig.RECONNECT_BACKOFF_MS_CONFIG, "100");
        p.put(AdminClientConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "500");
        p.put(AdminClientConfig.RETRY_BACKOFF_MS_CONFIG, "100");
        p.put("retry.backoff.max.ms", "500");
        p.put(AdminClientConfig.SOCKET_CONNECTION_SETUP_TIMEOUT_MS_CONFIG, "1000");
        p.put(AdminClientConfig.SOCKET_CONNECTION_SETUP_TIMEOUT_MAX_MS_CONFIG, "2000");

        String last = "no attempt yet";
        try (Admin admin = Admin.create(p)) {
            while (true) {
                if (pid > 0 && !alive(pid)) {
                    System.err.println("broker process " + pid + " exited");
                    System.exit(3);
                }
                // Keep each attempt within the overall deadline (at least 500 ms).
                int t = (int) Math.max(500, Math.min(3000, (deadline - System.nanoTime()) / 1_000_000L));
                try {
                    DescribeClusterResult dc = admin.describeCluster(new DescribeClusterOptions().timeoutMs(t));
                    String clusterId = dc.clusterId().get();
                    Collection<Node> nodes = dc.nodes().get();
                    if (nodes.isEmpty()) {
                        throw new IllegalStateException("no broker registered yet");
                    }
                    admin.listTopics(new ListTopicsOptions().listInternal(true).timeoutMs(t)).names().get();
                    try {
                        admin.describeConsumerGroups(List.of("kcr-kafka-probe"),
                                new DescribeConsumerGroupsOptions().timeoutMs(Math.max(t, 2000))).all().get();
                    } catch (ExecutionException e) {
                        if (!(e.getCause() instanceof GroupIdNotFoundException)) {
                            throw e;
                        }
                    }
                    System.out.println("cluster " + clusterId + ", " + nodes.size() + " broker(s)");
                    return;
                } catch (ExecutionException e) {
                    last = String.valueOf(e.getCause());
                } catch (Exception e) {
                    last = e.toString();
                }
                if (System.nanoTime() > deadline) {
                    System.err.println("not ready: " + last);
                    System.exit(2);
                }
                Thread.sleep(200);
            }
        }
    }

    /** Alive and not a zombie (an exited child nobody reaped still "exists"). */
    static boolean alive(long pid) {
        try {
            String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
            int i = stat.lastIndexOf(')');
            return i < 0 || i + 2 >= stat.length() || stat.charAt(i + 2) != 'Z';
        } catch (Exception e) {
            return ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false);
        }
    }
}
